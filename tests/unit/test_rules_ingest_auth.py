"""Bearer-token checks: who matched, why not, and that every token is compared every time."""

from __future__ import annotations

import hmac

import pytest

from gpumond.rules.ingest.auth import ANONYMOUS, TokenAuth

TOKENS = ["first-token-0123456789", "second-token-0123456789", "third-token-0123456789"]


def test_each_token_is_identified_by_its_position_never_by_its_value() -> None:
    auth = TokenAuth(TOKENS)
    for i, token in enumerate(TOKENS):
        result = auth.check(f"Bearer {token}")
        assert result.identity == f"token#{i}" and not result.problem
        assert token not in result.identity


@pytest.mark.parametrize("header", [f"bearer {TOKENS[1]}", f"BEARER   {TOKENS[1]} ", f"  Bearer {TOKENS[1]}"])
def test_the_scheme_is_case_insensitive_and_spaces_are_tolerated(header: str) -> None:
    assert TokenAuth(TOKENS).check(header).identity == "token#1"


@pytest.mark.parametrize("header", [None, "", "   "])
def test_missing_credentials(header: str | None) -> None:
    result = TokenAuth(TOKENS).check(header)
    assert result.identity is None and result.missing
    assert result.problem == "missing bearer token: send 'Authorization: Bearer <token>'"


@pytest.mark.parametrize(
    ("header", "problem"),
    [
        ("Bearer wrong-token-0123456789", "invalid bearer token"),
        (f"Bearer {TOKENS[0]}x", "invalid bearer token"),
        (f"Bearer {TOKENS[0][:-1]}", "invalid bearer token"),
        (f"Basic {TOKENS[0]}", "Authorization must be 'Bearer <token>'"),
        ("Bearer", "Authorization must be 'Bearer <token>'"),
        ("Bearer \udcff\udcfe-not-utf8", "invalid bearer token"),
    ],
)
def test_wrong_credentials(header: str, problem: str) -> None:
    result = TokenAuth(TOKENS).check(header)
    assert result.identity is None and not result.missing
    assert result.problem == problem
    assert TOKENS[0] not in result.problem


def test_every_token_is_compared_whichever_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(len(a) + len(b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    auth = TokenAuth(TOKENS)
    for header in (f"Bearer {TOKENS[0]}", f"Bearer {TOKENS[2]}", "Bearer nope-nope-nope-nope"):
        calls.clear()
        auth.check(header)
        # Digests are compared, so every comparison is of equal, fixed lengths (32 + 32 bytes).
        assert calls == [64, 64, 64]


def test_allow_unauthenticated_accepts_no_token_but_still_refuses_a_wrong_one() -> None:
    auth = TokenAuth([], allow_unauthenticated=True)
    assert auth.check(None).identity == ANONYMOUS
    assert auth.check("Bearer some-token-0123456789").problem == "invalid bearer token"
    with_tokens = TokenAuth(TOKENS, allow_unauthenticated=True)
    assert with_tokens.check(None).identity == ANONYMOUS
    assert with_tokens.check(f"Bearer {TOKENS[1]}").identity == "token#1"


def test_no_tokens_and_no_permission_refuses_everything() -> None:
    auth = TokenAuth([])
    assert auth.check(None).identity is None
    assert auth.check(f"Bearer {TOKENS[0]}").identity is None


def test_the_repr_does_not_show_tokens() -> None:
    text = repr(TokenAuth(TOKENS)) + str(TokenAuth(TOKENS).__dict__)
    assert all(t not in text for t in TOKENS)
