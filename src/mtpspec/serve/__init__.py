"""An OpenAI-compatible HTTP server around `prefill` / `step`: one decoding worker, a bounded
queue, streamed rounds, and a playground page. The app (`mtpspec.serve.app.create_app`) needs
the `serve` extra (fastapi, uvicorn); the engine needs only mtpspec."""

from .engine import Engine, ServeConfig, load_engine

__all__ = ["Engine", "ServeConfig", "load_engine"]
