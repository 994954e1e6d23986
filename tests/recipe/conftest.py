import pytest

from tests.conftest import tiny_recipe


@pytest.fixture
def base(tiny_checkpoint, tiny_data):
    """The tiny recipe every recipe test edits: a sound one, as a dict."""
    return tiny_recipe(tiny_checkpoint, tiny_data)
