"""A small numpy transformer and its pipelined run across Ray stage actors."""
