"""Root conftest: the namespace of the docstring examples (doctest).

`bash .ci/test.sh` runs `pytest --doctest-modules keras_jumbo` in the JAX
pass, so every `>>>` example in the library is executed.
"""

import numpy as np
import pytest


@pytest.fixture(autouse=True)
def _doctest_namespace(doctest_namespace):
    doctest_namespace["np"] = np
