"""Names of the files and folders in an output folder, in one place.

Kept apart (no imports) so that readers of a saved session import nothing heavy.
"""

SESSION_FILE = "session.json"
REPORT_FILE = "report.html"
TENSORBOARD_DIR = "tensorboard"  # TensorBoard event files
TRACE_DIR = "trace"  # Kineto traces, in the layout the TensorBoard profiler plugin reads
MEMORY_DIR = "memory"  # CUDA memory snapshots
