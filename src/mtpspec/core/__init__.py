"""What runs at decode time: the frozen target, the MTP head, drafts, acceptance rules and the one loop."""
