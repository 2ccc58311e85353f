"""Parity fixtures: the reference chattts==0.2.5 venv (built on first use) and a client that runs tasks in it."""
from __future__ import annotations

import pytest

from .refclient import RefClient, RefUnavailable, ensure_ref_venv


@pytest.fixture(scope="session")
def ref_client() -> RefClient:
    """Builds the venv when missing (CHATTTS_REF_BUILD=0 turns that into a skip); a failed build is an error."""
    try:
        python = ensure_ref_venv()
    except RefUnavailable as reason:
        pytest.skip(str(reason))
    return RefClient(python)
