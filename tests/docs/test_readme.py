"""README.md: at most 12,000 bytes, and the two set-up commands CI depends on, exactly."""
from tests.docs import pages


def test_readme_is_short():
    size = len((pages.ROOT / "README.md").read_bytes())
    assert size <= 12000, f"README.md is {size} bytes; move detail into docs/"


def test_readme_keeps_the_two_commands():
    text = (pages.ROOT / "README.md").read_text()
    blocks = ["\n".join(b) for lang, _, b in pages.fenced_blocks(text) if lang in pages.SHELLS]
    first = next(b for b in blocks if "make train" in b)
    assert "make train" in first and "make test" in first
    assert first.index("make train") < first.index("make test")


def test_readme_links_every_docs_page():
    text = (pages.ROOT / "README.md").read_text()
    for p in pages.pages()[1:]:
        assert f"docs/{p.name}" in text, f"README.md does not link docs/{p.name}"
