"""A GGUF file's own tokenizer, built from the fields its reader already holds."""

from __future__ import annotations

from pathlib import Path

from qkvlab.analysis._files import check_hf_folder
from qkvlab.inputs import InputFileError


def gguf_tokenizer(reader, path: Path):
    """The file's own tokenizer, built by transformers' GGUF converter from the open reader.

    ``AutoTokenizer.from_pretrained(gguf_file=...)`` would parse the whole file again (seconds
    for a 49k-token vocabulary); this hands the fields already read to the same converter, and
    falls back to that call if transformers' internal layout differs.
    """
    try:
        return _gguf_tokenizer(reader, path)
    except Exception as e:  # noqa: BLE001 - the tokenizers library raises plain Exception
        raise e if type(e) is not Exception else InputFileError(
            f"{path}: its tokenizer metadata does not build a tokenizer ({e})", path=path)


def _gguf_tokenizer(reader, path: Path):
    try:  # transformers is lazy here and below: optional extra [analysis]
        from transformers import PreTrainedTokenizerFast
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (
            GGUF_TOKENIZER_MAPPING,
            convert_gguf_tokenizer,
        )

        tdict = {name: reader.fields[f"tokenizer.{key}"].contents()
                 for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
                 if f"tokenizer.{key}" in reader.fields}
        arch = reader.fields["general.architecture"].contents()
        backend, _ = convert_gguf_tokenizer(arch, tdict)
        tok = PreTrainedTokenizerFast(tokenizer_object=backend)
        for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id")):
            if key in tdict:
                setattr(tok, name, tdict["tokens"][tdict[key]])
        return tok
    except (ImportError, KeyError, AttributeError, TypeError, ValueError):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(check_hf_folder(path), gguf_file=path.name,
                                             local_files_only=True, trust_remote_code=False)
