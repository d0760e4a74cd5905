"""What people *see*: the CLI, config parsing, summaries, validation, reports."""
