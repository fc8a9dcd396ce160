"""README.md and docs/*.md stay true: every relative link and image resolves
(anchors included), and every `python algos/<agent>.py ...` or
`python scripts/<tool>.py ...` written in them names flags that exist. A
renamed flag or a moved page breaks this test instead of a reader's first try.

Flags are read from the code, not from a list: an agent's are its Config
fields as tyro spells them (`field_name` -> `--field-name`, and
`--no-field-name` for a boolean), a tool's are its argparse parser's
(`build_parser()`; benchmark.py's per mode, sweep.py's plus the agent's).
"""
import dataclasses
import functools
import glob
import importlib
import os
import re
import shlex
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

AGENTS = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "algos", "*.py"))
                if not os.path.basename(p).startswith("_"))


def doc_files():
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def _rel(path):
    return os.path.relpath(path, ROOT)


# --------------------------------------------------------------------------- markdown

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
INLINE = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_SRC = re.compile(r"<(?:img|a)\b[^>]*?\b(?:src|href)=\"([^\"]+)\"", re.I)


def _blank(m) -> str:
    return "\n" * m.group(0).count("\n")  # keeps the line numbers


def prose(text: str) -> str:
    """The text without code blocks and inline code (links there are not
    links), on the same lines."""
    return INLINE.sub(_blank, FENCE.sub(_blank, text))


def code(text: str):
    """(line number, command text) of every line of a code block and every
    inline code span; a line ending in a backslash continues on the next."""
    out = []
    for m in FENCE.finditer(text):
        first = text.count("\n", 0, m.start()) + 1
        lines = m.group(0).splitlines()[1:-1]
        i = 0
        while i < len(lines):
            start, line = i, lines[i]
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i].strip()
            out.append((first + 1 + start, line))
            i += 1
    blanked = FENCE.sub(_blank, text)
    for m in INLINE.finditer(blanked):
        out.append((blanked.count("\n", 0, m.start()) + 1, m.group(2).replace("\n", " ")))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped
    (underscores and hyphens kept), spaces to hyphens."""
    text = re.sub(r"[`*]|!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@functools.lru_cache(None)
def anchors(path: str):
    text = FENCE.sub("", open(path).read())
    seen, out = {}, set()
    for h in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        s = slug(h)
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def broken_links(path: str, text: str):
    problems = []
    body = prose(text)
    for m in list(LINK.finditer(body)) + list(HTML_SRC.finditer(body)):
        target = m.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        where = f"{_rel(path)}:{body.count(chr(10), 0, m.start()) + 1}: "
        if not os.path.exists(dest):
            problems.append(f"{where}{target!r} does not exist")
        elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
            problems.append(f"{where}{target!r}: no heading with anchor #{anchor} in {_rel(dest)}")
    return problems


# --------------------------------------------------------------------------- commands

COMMAND = re.compile(r"\bpython3?\s+(algos|scripts)/([\w<>.-]+?)\.py\b([^\n]*)")
STOP = re.compile(r"\s(?:#|&&|\|\|?|;)|[;)]\s*$")  # a comment or the next command


def flags(args: str):
    """The flags on a command line after the script (`--x=1` -> `--x`)."""
    try:
        tokens = shlex.split(args)
    except ValueError:  # an unbalanced quote: split on blanks
        tokens = args.split()
    return [t.split("=", 1)[0] for t in tokens if re.match(r"--?[A-Za-z]", t)], tokens


@functools.lru_cache(None)
def agent_flags(agent: str) -> frozenset:
    config = importlib.import_module(f"algos.{agent}").Config
    out = {"-h", "--help"}
    for f in dataclasses.fields(config):
        name = f.name.replace("_", "-")
        out.add(f"--{name}")
        if f.type in (bool, "bool"):
            out.add(f"--no-{name}")
    return frozenset(out)


def parser_flags(parser) -> frozenset:
    return frozenset(s for a in parser._actions for s in a.option_strings)


def subparsers(parser):
    import argparse
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            return a.choices
    return {}


@functools.lru_cache(None)
def tool_parser(tool: str):
    return importlib.import_module(tool).build_parser()


def valid_flags(kind: str, name: str, tokens):
    """The flags `python <kind>/<name>.py` accepts, given its other tokens;
    None when there is no such agent, tool or mode of the tool."""
    if kind == "algos":
        if name in AGENTS:
            return agent_flags(name)
        if "<" in name:  # python algos/<agent>.py: what every agent accepts
            return frozenset.intersection(*map(agent_flags, AGENTS))
        return None
    if not os.path.exists(os.path.join(ROOT, "scripts", f"{name}.py")):
        return None
    parser = tool_parser(name)
    valid = parser_flags(parser)
    modes = subparsers(parser)
    if modes:  # benchmark.py MODE: that mode's flags (any mode's for a placeholder)
        mode = next((t for t in tokens if not t.startswith("-")), None)
        if mode is not None and mode not in modes and mode.islower() and "<" not in mode:
            return None
        chosen = [modes[mode]] if mode in modes else list(modes.values())
        valid |= frozenset().union(*map(parser_flags, chosen))
    if name == "sweep":  # every other flag goes to the agent
        algo = tokens[tokens.index("--algo") + 1] if "--algo" in tokens[:-1] else None
        valid |= (agent_flags(algo) if algo in AGENTS
                  else frozenset().union(*map(agent_flags, AGENTS)))
    return valid


def commands(path: str, text: str):
    """(where, kind, name, args) of every agent or tool command in the file."""
    out = []
    for line, snippet in code(text):
        for m in COMMAND.finditer(snippet):
            args = m.group(3)
            stop = STOP.search(args)
            out.append((f"{_rel(path)}:{line}", m.group(1), m.group(2),
                        args[:stop.start()] if stop else args))
    return out


def bad_flags(path: str, text: str):
    problems = []
    for where, kind, name, args in commands(path, text):
        used, tokens = flags(args)
        valid = valid_flags(kind, name, tokens)
        if valid is None:
            what = "agent" if kind == "algos" else "tool" if not os.path.exists(
                os.path.join(ROOT, kind, f"{name}.py")) else f"mode {tokens[0]!r}"
            problems.append(f"{where}: python {kind}/{name}.py: no such {what}")
            continue
        for flag in used:
            if flag not in valid:
                problems.append(f"{where}: python {kind}/{name}.py{args.rstrip()}: {flag} is not "
                                f"an option of {kind}/{name}.py")
    return problems


# --------------------------------------------------------------------------- tests

def test_every_relative_link_and_image_resolves():
    problems = [p for path in doc_files() for p in broken_links(path, open(path).read())]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_every_command_names_flags_that_exist():
    found = {path: commands(path, open(path).read()) for path in doc_files()}
    assert found[os.path.join(ROOT, "README.md")], "no command found in README.md: parser broken?"
    problems = [p for path in doc_files() for p in bad_flags(path, open(path).read())]
    assert not problems, "flags that do not exist:\n" + "\n".join(problems)


def test_the_checks_catch_a_broken_link_a_made_up_flag_and_a_missing_tool(tmp_path):
    """The checkers themselves, on a planted page (so a checker that finds
    nothing cannot pass the two tests above by accident)."""
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# A heading\n")
    text = ("[ok](there.md#a-heading) [gone](missing.md) ![img](nope.png) "
            "[bad anchor](there.md#elsewhere) [web](https://example.org/x)\n\n"
            "```bash\npython algos/td3.py --env walker_walk --num-seeds 4  # fine\n"
            "python algos/td3.py --env walker_walk \\\n    --num-seedz 4\n"
            "python scripts/sweep.py --algo sac --sweep tau=0.1 --learning-starts 10\n"
            "python scripts/benchmark.py standard --report-only\n"
            "python scripts/benchmark.py envs --report-only\n"
            "python scripts/benchmark.py MODE --help\n"
            "python scripts/benchmark.py sprint --quick\n"
            "python scripts/nosuch.py --x\n```\n"
            "and `python algos/ppo.py --anneal-lr --no-norm-adv --help`.\n")
    page.write_text(text)
    links = broken_links(str(page), text)
    assert len(links) == 3 and "missing.md" in links[0] and "nope.png" in links[1], links
    assert "#elsewhere" in links[2], links
    problems = bad_flags(str(page), text)
    assert len(problems) == 4, problems
    assert "--num-seedz" in problems[0] and ":5:" in problems[0]   # where the command starts
    assert "--report-only" in problems[1] and "envs" in problems[1]
    assert "benchmark.py: no such mode 'sprint'" in problems[2]
    assert "nosuch.py: no such tool" in problems[3]
