"""The node agent behind ``stalwart run``: spawn and supervise workers, restart and world-size policies."""
