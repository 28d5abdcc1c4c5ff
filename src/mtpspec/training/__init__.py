"""Making a head: self-distillation data, cached target activations, training."""
