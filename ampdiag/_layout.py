"""Names of the files in an output folder, kept apart so that readers import nothing heavy."""

SESSION_FILE = "session.json"
