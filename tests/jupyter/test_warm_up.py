"""The Lab server's reader processes warm up before they fork (`_records.warm_up_readers`): a tiny
record is exported, saved, read back and viewed, leaving nothing behind."""

from __future__ import annotations

import tempfile
from pathlib import Path


def test_warm_up_views_a_tiny_record_and_cleans_up():
    from etlab.jupyter._records import warm_up_readers

    before = set(Path(tempfile.gettempdir()).glob("etlab-warm-*"))
    warm_up_readers()
    assert set(Path(tempfile.gettempdir()).glob("etlab-warm-*")) == before
