"""How hard a new passphrase is to guess, before an account or a passphrase change uses it.

The passphrase guards the key bundle, which the relay keeps and any backup carries: anyone who
copies either can try guesses offline, as fast as Argon2id lets them. zxcvbn estimates the
guesses an attacker with dictionaries, common passwords and patterns needs; a new passphrase
must score at least `MIN_SCORE` (of 0 to 4: about 10^10 guesses or more). An existing passphrase
is never refused: it still unlocks.
"""

from __future__ import annotations

from replica.errors import WeakPassphraseError

MIN_SCORE = 3
"""zxcvbn's "safely unguessable": about 10^10 guesses, years at Argon2id's floor cost."""
MAX_JUDGED_CHARS = 72
"""zxcvbn judges at most this many characters; a longer passphrase is judged by its start."""
RELATED_WORDS = ["sealsync", "passphrase", "password"]


def check_new_passphrase(passphrase: str) -> None:
    """Raise `WeakPassphraseError`, saying why and how to do better, if `passphrase` is too
    easy to guess to protect an account. Says nothing of the passphrase itself."""
    # imported here, as relay/serve.py imports psycopg: its dictionaries take 22 ms to load
    # (`python -X importtime -c "import zxcvbn"`), which every command importing replica paid
    from zxcvbn import zxcvbn  # type: ignore[import-untyped]  # noqa: PLC0415

    judged = zxcvbn(passphrase[:MAX_JUDGED_CHARS], user_inputs=RELATED_WORDS)
    if judged["score"] >= MIN_SCORE:
        return
    feedback = judged["feedback"]
    why = feedback["warning"] or "it is short or predictable"
    advice = " ".join(feedback["suggestions"]) or "Add another word or two."
    raise WeakPassphraseError(
        f"the passphrase is too easy to guess (strength {judged['score']} of 4, at least "
        f"{MIN_SCORE} needed): {why.rstrip('.')}",
        hint=f"{advice} Four or more unrelated words make a good passphrase.",
    )
