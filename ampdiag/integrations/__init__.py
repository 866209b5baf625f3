"""Framework integrations: a diagnosis opened and closed inside the framework's own loop.

One adapter per framework, each a thin translation of its callback events into
`ampdiag.sources.live.loop.LoopWindow` (framework-free), and each importing its framework
only when it is itself imported. Their arguments are taken in one place,
`ampdiag.integrations.window_callback.WindowCallback`, which both callbacks extend::

    from ampdiag.integrations.hf import DiagnoseCallback          # transformers.Trainer
    from ampdiag.integrations.lightning import DiagnoseCallback   # lightning.Trainer

``import ampdiag`` (and this package) imports neither framework.
"""
