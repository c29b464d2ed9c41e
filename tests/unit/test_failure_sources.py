"""Root cause of a failed rank without the SDK: torch elastic's @record file, or the log's traceback."""

from __future__ import annotations

import json
from pathlib import Path

from stalwart.diagnose.root_cause import classify, error_from_log, read_elastic_error

LOG = """epoch 0 loss 0.6410
Traceback (most recent call last):
  File "/home/u/train.py", line 80, in <module>
    main()
  File "/home/u/train.py", line 52, in main
    lr = cfg["learning_rate"]
         ~~~^^^^^^^^^^^^^^^^^
KeyError: 'learning_rate'
[rank1]:[W1122 23:39:31] ProcessGroupGloo: destroy_process_group() was not called
"""


def test_the_last_traceback_in_a_log_is_the_root_cause():
    err = error_from_log(LOG)
    assert err is not None and err.type == "KeyError" and err.message == "'learning_rate'"
    assert err.place == "train.py:52" and err.signature == "KeyError: 'learning_rate' at train.py:52"
    assert classify(1, err) == "exception"
    assert "ProcessGroupGloo" not in err.traceback  # lines after the exception line are not part of it


def test_the_same_exception_elsewhere_has_another_signature():
    other = error_from_log(LOG.replace("line 52", "line 61"))
    assert other is not None and other.signature != error_from_log(LOG).signature


def test_a_log_without_a_traceback_has_no_root_cause():
    assert error_from_log("epoch 0\nKilled\n") is None
    assert error_from_log("") is None


def test_comm_errors_in_the_log_point_elsewhere():
    log = (
        'Traceback (most recent call last):\n  File "t.py", line 3, in <module>\n'
        "torch.distributed.DistBackendError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer\n"
    )
    err = error_from_log(log)
    assert err is not None and classify(1, err) == "peer_lost"


def test_torch_elastic_record_files_are_read(tmp_path: Path):
    path = tmp_path / "err.json"
    path.write_text(
        json.dumps(
            {
                "message": {
                    "message": "ValueError: bad shape",
                    "extraInfo": {
                        "py_callstack": 'Traceback (most recent call last):\n  File "/x/m.py", line 9, in f\nValueError: bad shape\n',
                        "timestamp": "1700000000",
                    },
                }
            }
        )
    )
    err = read_elastic_error(path)
    assert (
        err is not None and err.type == "ValueError" and err.message == "bad shape" and err.place == "m.py:9"
    )
    assert err.ts == 1700000000.0
    assert read_elastic_error(tmp_path / "missing.json") is None
    (tmp_path / "junk.json").write_text("{")
    assert read_elastic_error(tmp_path / "junk.json") is None


def test_tracebacks_prefixed_by_torch_or_tee_are_read():
    prefixed = "\n".join(f"[rank1]: {line}" if line else line for line in LOG.splitlines())
    err = error_from_log(prefixed)
    assert err is not None and err.signature == "KeyError: 'learning_rate' at train.py:52"
