"""A live run: ``diagnose()`` (the engine), the discovery hooks and the collectors."""
