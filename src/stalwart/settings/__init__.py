"""The settings of ``stalwart run``, declared once: the schema of nested models (``schema.py`` and
the concerns beside it), the sources that fill it (defaults < file < environment < flags), and the
run's validated configuration (``run_config.py``); the command line, its help and the simulator
derive from it."""
