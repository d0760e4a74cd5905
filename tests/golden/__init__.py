"""Golden outputs of the examples, and the README numbers rendered from them."""
