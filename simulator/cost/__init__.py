"""Cost models behind small interfaces: how long a kernel, a collective or a copy takes."""
