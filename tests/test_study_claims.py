"""Quotes from the seed threads: verbatim where the threads are on disk, flagged where not."""

from __future__ import annotations

from qkvlab.studies.qkv.plan import claims as C


def test_quotes_are_verbatim_in_the_seed_files():
    got, note = C.resolved_claims()
    assert sorted(got) == ["q1", "q2", "q3"]
    flags = {c["quote"]: c["verified"] for q in got.values() for c in q}
    if C.seeds_dir() is not None:
        assert flags == {c.quote: True for q in C.CLAIMS.values() for c in q}
        assert note.startswith("Quotes checked against")
    else:
        assert flags == {c.quote: False for q in C.CLAIMS.values() for c in q}
        assert note.startswith("Seed threads not found")


def test_a_quote_missing_from_its_file_is_flagged(tmp_path, monkeypatch):
    (tmp_path / "001_x.txt").write_text("we tried,   it’s slower and not more accurate")
    monkeypatch.setenv("QKVLAB_SEEDS", str(tmp_path))
    got, _ = C.resolved_claims()
    flags = {c["quote"]: c["verified"] for c in got["q1"]}
    assert flags["we tried, it's slower and not more accurate"] is True  # whitespace, ’ normalized
    assert flags["the result is just a convex combination of values"] is False
