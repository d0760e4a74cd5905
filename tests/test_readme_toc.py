"""The README opens with a table of contents that lists every section, and its links lead
somewhere (a section, or a file such as docs/network.md)."""

import re

from tests.conftest import REPO

README = (REPO / "README.md").read_text()


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_contents_list_every_section_in_order():
    contents = README[README.index("## Contents\n"):].split("\n\n")[1]
    listed = re.findall(r"^- \[(.+)\]\(#([\w-]+)\)$", contents, re.M)
    sections = [h for h in re.findall(r"^## (.+)$", README, re.M) if h != "Contents"]
    assert [name for name, _ in listed] == sections
    assert all(link == anchor(name) for name, link in listed)


def test_every_link_of_the_readme_and_docs_leads_somewhere():
    anchors = {anchor(h) for h in re.findall(r"^#+ (.+)$", README, re.M)}
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            path, _, fragment = target.partition("#")
            if path:
                assert (doc.parent / path).exists(), f"{doc.name}: {target}"
            if fragment and (not path or path.endswith("README.md")):
                assert fragment in anchors, f"{doc.name}: {target}"
    assert "](docs/network.md)" in README
