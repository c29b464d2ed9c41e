"""In-place recovery: the explicit machine (``machine.py``: phases, the frozen state and the
transition table), its runner on this node (``recovery.py``) and across nodes (``nodes.py``), the
signed board the agents tell each other on (``board.py``, ``board_state.py``, ``board_records.py``),
a hot spare's take-over and a returning node's rejoin."""
