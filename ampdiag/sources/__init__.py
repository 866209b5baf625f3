"""Sources: everything a Session is made from.

- `live`: a run under ``diagnose()`` (the engine, discovery hooks and collectors);
- `traces`: a Kineto trace file or a folder of ranks' traces;
- `snapshot`: a CUDA allocator snapshot pickle (read without running code from it);
- a saved session is read by `ampdiag.session.load`.

Each produces a `ampdiag.session.Session`; `ampdiag.analysis` derives from it and
`ampdiag.render` formats it.
"""
