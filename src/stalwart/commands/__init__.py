"""Sub-commands of ``stalwart``: each module exposes ``register(app: typer.Typer)``."""
