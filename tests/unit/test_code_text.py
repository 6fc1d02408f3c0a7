"""bench_text.code_text: the Python library's sources in path order, generated codec tables left out,
up to a size; text_identity names a text so that benchmark runs compare only on the same one.
A real directory tree stands in for the library (sysconfig's stdlib path pointed at it)."""
from __future__ import annotations

import sysconfig

from engram_client.tools import bench_text


def test_code_text_reads_sources_in_path_order_without_codec_tables(tmp_path, monkeypatch):
    (tmp_path / "encodings").mkdir()
    (tmp_path / "encodings" / "cp866.py").write_text("decoding_table = ('\\x00' * 256)\n")
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "decoder.py").write_text("def decode(s):\n    return s\n")
    (tmp_path / "abc.py").write_text("class ABC:\n    pass\n")
    (tmp_path / "zz.py").write_bytes(b"\xff\xfe not utf-8")  # unreadable as UTF-8: skipped
    paths = dict(sysconfig.get_paths(), stdlib=str(tmp_path))
    monkeypatch.setattr(sysconfig, "get_paths", lambda *args, **kwargs: paths)
    text = bench_text.code_text(1 << 20)
    assert text == "class ABC:\n    pass\n\n\ndef decode(s):\n    return s\n"
    assert bench_text.code_text(5) == "class"  # cut at the size asked
    first, again, other = (bench_text.text_identity(t) for t in (text, text, text + " "))
    assert first == again and first["sha256"] != other["sha256"] and first["chars"] == len(text)
    assert first["python"].count(".") == 2
