"""TeX math as rich text a QLabel can draw, with no network and no dependency.

Common constructs only: greek letters, operators, relations and arrows as Unicode; ^ and _ as
superscript and subscript; \\frac{a}{b} as a/b with the parts raised and lowered; \\sqrt{x} as √ with a
bar over x; \\mathbb{R} as ℝ; \\text{...}, \\mathrm{...}, \\mathbf{...} as text; \\left / \\right dropped.
Anything else (matrices, environments, unknown commands) is shown as its source, in the math style.
"""

from __future__ import annotations

import html
import re

SYMBOLS = {
    # greek
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "epsilon": "ε", "varepsilon": "ε", "zeta": "ζ",
    "eta": "η", "theta": "θ", "vartheta": "ϑ", "iota": "ι", "kappa": "κ", "lambda": "λ", "mu": "μ", "nu": "ν",
    "xi": "ξ", "pi": "π", "rho": "ρ", "sigma": "σ", "tau": "τ", "upsilon": "υ", "phi": "φ", "varphi": "φ",
    "chi": "χ", "psi": "ψ", "omega": "ω", "Gamma": "Γ", "Delta": "Δ", "Theta": "Θ", "Lambda": "Λ", "Xi": "Ξ",
    "Pi": "Π", "Sigma": "Σ", "Phi": "Φ", "Psi": "Ψ", "Omega": "Ω",
    # operators and relations
    "times": "×", "cdot": "·", "div": "÷", "pm": "±", "mp": "∓", "leq": "≤", "le": "≤", "geq": "≥", "ge": "≥",
    "neq": "≠", "ne": "≠", "approx": "≈", "equiv": "≡", "sim": "∼", "propto": "∝", "infty": "∞", "partial": "∂",
    "nabla": "∇", "sum": "∑", "prod": "∏", "int": "∫", "oint": "∮", "in": "∈", "notin": "∉", "subset": "⊂",
    "subseteq": "⊆", "cup": "∪", "cap": "∩", "emptyset": "∅", "forall": "∀", "exists": "∃", "neg": "¬",
    "land": "∧", "lor": "∨", "to": "→", "rightarrow": "→", "leftarrow": "←", "Rightarrow": "⇒",
    "Leftarrow": "⇐", "iff": "⇔", "Leftrightarrow": "⇔", "mapsto": "↦", "ldots": "…", "cdots": "⋯",
    "dots": "…", "circ": "∘", "degree": "°", "angle": "∠", "perp": "⊥", "parallel": "∥", "hbar": "ℏ",
    "ell": "ℓ", "langle": "⟨", "rangle": "⟩", "lfloor": "⌊", "rfloor": "⌋", "lceil": "⌈", "rceil": "⌉",
    "log": "log", "ln": "ln", "exp": "exp", "sin": "sin", "cos": "cos", "tan": "tan", "lim": "lim",
    "max": "max", "min": "min", "det": "det", "mod": "mod", "quad": "\u2003", "qquad": "\u2003\u2003",
    ",": "\u2009", ";": "\u2005", ":": "\u2005", "!": "", " ": " ", "{": "{", "}": "}", "%": "%", "$": "$",
    "#": "#", "&": "&", "_": "_", "|": "‖", "left": "", "right": "", "displaystyle": "",
}
BLACKBOARD = {"R": "ℝ", "N": "ℕ", "Z": "ℤ", "Q": "ℚ", "C": "ℂ", "P": "ℙ"}
TEXT_COMMANDS = ("text", "mathrm", "mathbf", "mathit", "operatorname", "textbf", "mathsf", "mathcal")
TOKEN = re.compile(r"\\([A-Za-z]+|.)|([{}^_])|([^\\{}^_]+)", re.S)


def math_html(tex: str) -> str:
    """The rich text of one formula (the caller wraps it in its style)."""
    if "\\begin" in tex:                      # environments (matrices, aligned): the source as it is
        return html.escape(tex.strip())
    tokens = [m.groups() for m in TOKEN.finditer(tex.strip())]
    return _Converter(tokens).run()


class _Converter:
    def __init__(self, tokens):
        self.tokens, self.i = tokens, 0

    def run(self, stop_at_brace: bool = False) -> str:
        out: list[str] = []
        while self.i < len(self.tokens):
            command, mark, text = self.tokens[self.i]
            self.i += 1
            if mark == "}":
                if stop_at_brace:
                    return "".join(out)
                continue
            out.append(self._one(command, mark, text))
        return "".join(out)

    def _argument(self) -> str:
        """The next group {...} or single token, converted."""
        if self.i >= len(self.tokens):
            return ""
        command, mark, text = self.tokens[self.i]
        self.i += 1
        if mark == "{":
            return self.run(stop_at_brace=True)
        if text:                                  # a bare argument takes one character: x^2y is x² y
            first, rest = text[0], text[1:]
            if rest:
                self.i -= 1
                self.tokens[self.i] = (None, None, rest)
            return html.escape(first)
        return self._one(command, mark, text)

    def _raw_argument(self) -> str:
        """The next group's source text ({R} -> "R")."""
        if self.i < len(self.tokens) and self.tokens[self.i][1] == "{":
            depth, parts = 0, []
            while self.i < len(self.tokens):
                command, mark, text = self.tokens[self.i]
                self.i += 1
                depth += mark == "{"
                depth -= mark == "}"
                if depth == 0:
                    break
                if not (mark == "{" and depth == 1):
                    parts.append(text or mark or ("\\" + command if command else ""))
            return "".join(parts)
        return self._argument()

    def _one(self, command, mark, text) -> str:
        if text is not None:
            return html.escape(text)
        if mark == "{":
            return self.run(stop_at_brace=True)
        if mark == "^":
            return f"<sup>{self._argument()}</sup>"
        if mark == "_":
            return f"<sub>{self._argument()}</sub>"
        if command == "frac" or command == "dfrac" or command == "tfrac":
            top, bottom = self._argument(), self._argument()
            return f"<sup>{top}</sup>\u2044<sub>{bottom}</sub>"
        if command == "sqrt":
            return f"√<span style=\"text-decoration: overline;\">{self._argument()}</span>"
        if command == "mathbb":
            raw = self._raw_argument()
            return "".join(BLACKBOARD.get(c, c) for c in raw)
        if command in TEXT_COMMANDS:
            return html.escape(self._raw_argument())
        if command in SYMBOLS:
            return SYMBOLS[command]
        return html.escape("\\" + command)
