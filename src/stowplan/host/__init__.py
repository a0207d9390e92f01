"""One host: its devices, their fabric and the residency of a model on them."""
