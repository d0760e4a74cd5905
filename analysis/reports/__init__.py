"""What people read: the terminal summary of a step, the figures, and the HTML/Markdown report
rendered from a folder's stored results (a report never runs a command)."""
