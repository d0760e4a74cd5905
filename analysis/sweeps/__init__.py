"""Strategy sweeps and cluster comparisons: the space of strategies, running it in parallel into
a resumable folder, the ranking with its cost, energy and failure-exposure columns, and
``compare`` (clusters side by side)."""
