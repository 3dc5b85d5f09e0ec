"""Random Jinja templates for differential testing against jinja2.

generate(seed, count) returns (template, variables) pairs built from a grammar covering literals,
operators, filters, tests, attribute/item access, slicing, method calls, if/for/set/macro blocks and
whitespace control. Most of them render; many raise (type errors etc.) - both outcomes are compared.
"""

import random

VARIABLES = {
    "s": "Hello, Wörld! ",
    "e": "",
    "n": 7,
    "m": -3,
    "f": 2.5,
    "b": True,
    "z": None,
    "l": [3, 1, "two", None, [4, 5]],
    "nums": [5, 3, 8, 1],
    "words": ["b", "A", "c", "a"],
    "d": {"k": "v", "n": 2, "list": [1, 2], "nested": {"x": "y"}},
    "msgs": [
        {"role": "system", "content": " sys "},
        {"role": "user", "content": "hi <b>"},
        {"role": "assistant", "content": "<think>r</think>ok", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
        {"role": "tool", "content": "{\"r\": 1}"},
    ],
}

STRINGS = ["'a'", "'x y'", "''", "\"q'\"", "'\\n'", "'é'", "'{{'", "'%s'", "'A-b c'", "' pad '"]
FILTERS = [
    ("upper", []), ("lower", []), ("trim", []), ("capitalize", []), ("title", []), ("length", []),
    ("first", []), ("last", []), ("list", []), ("string", []), ("int", []), ("float", []),
    ("abs", []), ("round", []), ("round", ["1"]), ("join", ["', '"]), ("join", []),
    ("default", ["'dflt'"]), ("default", ["'dflt'", "true"]), ("replace", ["'a'", "'o'"]),
    ("reverse", []), ("sort", []), ("sort", ["reverse=true"]), ("unique", []), ("tojson", []),
    ("tojson", ["indent=2"]), ("items", []), ("dictsort", []), ("select", ["'odd'"]),
    ("reject", ["'none'"]), ("map", ["'string'"]), ("map", ["attribute='role'"]),
    ("selectattr", ["'role'", "'equalto'", "'user'"]), ("batch", ["2"]), ("center", ["9"]),
    ("indent", ["2"]), ("wordcount", []), ("count", []), ("e", []), ("safe", []), ("min", []),
    ("max", []), ("sum", []), ("format", ["1"]),
]
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping",
         "iterable", "sequence", "boolean", "true", "false", "odd", "even", "lower", "upper",
         "divisibleby 3", "equalto 7", "in [1, 'a']", "sameas none", "callable", "escaped"]
METHODS = ["upper()", "lower()", "strip()", "split()", "split(',')", "startswith('H')",
           "endswith(' ')", "replace('l', 'L')", "find('o')", "count('l')", "title()",
           "items()", "keys()", "values()", "get('k')", "get('missing', 0)", "index(3)",
           "rstrip('! ')", "lstrip('H')", "format(1)", "join(['a', 'b'])"]
SUBSCRIPTS = ["0", "-1", "1", "9", "'k'", "'role'", "1:3", "::-1", ":2", "-2:"]
ATTRIBUTES = ["role", "content", "k", "n", "nested", "x", "missing", "index", "length", "first"]
# Weighted towards operators that accept any operands, so more templates render.
BINARY = ["~"] * 4 + ["and", "or", "==", "!="] * 3 + ["+", "-", "*", "/", "//", "%", "**", "<",
                                                      ">", "<=", ">=", "in", "not in"]


class Gen:
    def __init__(self, rng):
        self.rng = rng

    def atom(self, depth):
        r = self.rng.random()
        if r < 0.35:
            names = list(VARIABLES) + (["missing", "loop"] if self.rng.random() < 0.2 else [])
            return self.rng.choice(names)
        if r < 0.5:
            return self.rng.choice(STRINGS)
        if r < 0.65:
            return self.rng.choice(["0", "1", "2", "-1", "10", "3.5", "0.1", "1e3", "true", "false", "none"])
        if r < 0.75 and depth > 0:
            items = ", ".join(self.expr(depth - 1) for _ in range(self.rng.randint(0, 3)))
            return f"[{items}]"
        if r < 0.8 and depth > 0:
            return "{" + f"'k': {self.expr(depth - 1)}, 'j': {self.expr(depth - 1)}" + "}"
        if r < 0.85:
            return f"range({self.rng.randint(0, 5)})"
        return f"({self.expr(max(depth - 1, 0))})"

    def postfix(self, base, depth):
        r = self.rng.random()
        if r < 0.15:
            return f"{base}.{self.rng.choice(ATTRIBUTES)}"
        if r < 0.3:
            index = self.rng.choice(SUBSCRIPTS)
            return f"{base}[{index}]"
        if r < 0.4:
            return f"{base}.{self.rng.choice(METHODS)}"
        if r < 0.6:
            name, args = self.rng.choice(FILTERS)
            call = f"({', '.join(args)})" if args else ""
            return f"({base}|{name}{call})"
        if r < 0.7:
            neg = "not " if self.rng.random() < 0.3 else ""
            return f"({base} is {neg}{self.rng.choice(TESTS)})"
        return base

    def expr(self, depth):
        e = self.postfix(self.atom(depth), depth)
        if self.rng.random() < 0.3:
            e = self.postfix(e, depth)
        r = self.rng.random()
        if depth > 0 and r < 0.35:
            e = f"{e} {self.rng.choice(BINARY)} {self.expr(depth - 1)}"
        elif depth > 0 and r < 0.45:
            e = f"({self.expr(depth - 1)} if {e} else {self.expr(depth - 1)})"
        elif r < 0.5:
            e = f"(not {e})"
        elif r < 0.55:
            e = f"-{e}"
        return e

    def ws(self):
        return self.rng.choice(["", "", "-", "+"]) if self.rng.random() < 0.5 else ""

    def text(self):
        return self.rng.choice(["", "x", " ", "\n", "  \n", "\n  ", "a\n\n", "\t", " y "])

    def block(self, depth):
        r = self.rng.random()
        open_l, open_r = "{%" + self.ws(), self.rng.choice(["", "-"]) + "%}"
        if depth <= 0 or r < 0.3:
            return self.text() + "{{" + self.ws().replace("+", "") + " " + self.expr(2) + " " + self.rng.choice(["", "-"]) + "}}" + self.text()
        if r < 0.5:
            body = self.body(depth - 1)
            other = self.body(depth - 1) if self.rng.random() < 0.5 else ""
            els = f"{open_l} else {open_r}{other}" if other else ""
            return f"{self.text()}{open_l} if {self.expr(2)} {open_r}{body}{els}{open_l} endif {open_r}{self.text()}"
        if r < 0.7:
            target = self.rng.choice(["x", "x", "k, v", "i"])
            it = self.rng.choice(["l", "nums", "msgs", "words", "d|items", "s", "range(3)", "d", self.expr(1)])
            cond = f" if {self.expr(1)}" if self.rng.random() < 0.2 else ""
            loopvar = self.rng.choice(["loop.index", "loop.first", "loop.last", "loop.length", "loop.revindex", "loop.previtem", "x"])
            body = self.body(depth - 1) + "{{ " + loopvar + " }}"
            els = f"{open_l} else {open_r}E" if self.rng.random() < 0.2 else ""
            return f"{open_l} for {target} in {it}{cond} {open_r}{body}{els}{open_l} endfor {open_r}"
        if r < 0.85:
            name = self.rng.choice(["v", "x", "s", "n"])
            return f"{open_l} set {name} = {self.expr(2)} {open_r}{self.text()}"
        if r < 0.88:
            return f"{open_l} set ns = namespace(c=0) {open_r}{open_l} for x in nums {open_r}{open_l} set ns.c = ns.c + x {open_r}{open_l} endfor {open_r}{{{{ ns.c }}}}"
        if r < 0.9:
            return f"{open_l} macro mac(a, b='B') {open_r}[{{{{ a }}}}|{{{{ b }}}}]{open_l} endmacro {open_r}{{{{ mac({self.expr(1)}) }}}}"
        if r < 0.92:
            return (f"{open_l} macro each(xs) {open_r}{{% for x in xs %}}<{{{{ caller(x) }}}}>{{% endfor %}}"
                    f"{open_l} endmacro {open_r}{open_l} call(v) each({self.rng.choice(['l', 'words', 's', 'd'])}) {open_r}"
                    f"{self.body(depth - 1)}{{{{ v }}}}{open_l} endcall {open_r}")
        if r < 0.94:
            return f"{open_l} set blk {open_r}{self.body(depth - 1)}{open_l} endset {open_r}[{{{{ blk }}}}]"
        if r < 0.95:
            return f"{open_l} filter {self.rng.choice(['upper', 'trim', 'title', 'indent(2)'])} {open_r}{self.body(depth - 1)}{open_l} endfilter {open_r}"
        if r < 0.96:
            return f"{open_l} with w = {self.expr(1)} {open_r}{self.body(depth - 1)}{{{{ w }}}}{open_l} endwith {open_r}"
        if r < 0.97:
            return "{#" + self.ws() + " note " + self.rng.choice(["", "-"]) + "#}" + self.text()
        if r < 0.98:
            return f"{open_l} for x in l {open_r}{{% if loop.index is {self.rng.choice(['odd', 'even'])} %}}{{% {self.rng.choice(['break', 'continue'])} %}}{{% endif %}}{{{{ loop.cycle('a', 'b') }}}}{{{{ loop.changed(x) }}}}{open_l} endfor {open_r}"
        if r < 0.99:
            return f"{open_l} raw {open_r}{{{{ {self.expr(1)} }}}}{open_l} endraw {open_r}"
        fmt = self.rng.choice(["'%s-%s'", "'{} {}'.format", "'{0!r}:{1}'.format"])
        if fmt.startswith("'%"):
            return f"{{{{ {fmt} % ({self.expr(1)}, {self.expr(1)}) }}}}"
        return f"{{{{ {fmt}({self.expr(1)}, {self.expr(1)}) }}}}"

    def body(self, depth):
        return "".join(self.block(depth) for _ in range(self.rng.randint(1, 3)))


def generate(seed, count):
    rng = random.Random(seed)
    gen = Gen(rng)
    # Half single blocks (most of them render), half multi-block bodies.
    return [(gen.block(rng.randint(1, 2)) if i % 2 else gen.body(2), VARIABLES) for i in range(count)]


WS_TEXT = ["", " ", "  ", "\t", "\n", "\n\n", "  \n", "\n  ", "\r\n", " \r\n ", "x", " y ", "\u3000",
           "\u00a0", "a\n b", "\n\t\n"]


def _ws_tag(rng, body):
    return rng.choice(["{%", "{%-", "{%+"]) + body + rng.choice(["%}", "-%}", "+%}"])


def generate_whitespace(seed, count):
    """Templates of text runs and tags with every whitespace-control marker, for the lexer."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        parts = []
        depth = 0
        for _ in range(rng.randint(1, 12)):
            parts.append(rng.choice(WS_TEXT))
            r = rng.random()
            if r < 0.2:
                parts.append(_ws_tag(rng, " if true "))
                depth += 1
            elif r < 0.35 and depth > 0:
                parts.append(_ws_tag(rng, " endif "))
                depth -= 1
            elif r < 0.55:
                parts.append(rng.choice(["{{", "{{-", "{{+"]) + " 'v' " + rng.choice(["}}", "-}}"]))
            elif r < 0.65:
                parts.append(rng.choice(["{#", "{#-", "{#+"]) + " c " + rng.choice(["#}", "-#}", "+#}"]))
            elif r < 0.75:
                parts.append(_ws_tag(rng, " set x = 1 "))
            elif r < 0.8:
                parts.append(_ws_tag(rng, " raw ") + rng.choice(WS_TEXT) + "{{ y }}" + _ws_tag(rng, " endraw "))
        parts.extend(_ws_tag(rng, " endif ") for _ in range(depth))
        parts.append(rng.choice(WS_TEXT))
        out.append(("".join(parts), {}))
    return out
