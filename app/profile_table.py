"""The table of concurrency profiles on the Settings page: the weights the engine loads, what each profile
gives a request (context) and where its memory goes (weights, KV cache, recurrent state, workspace), and
whether it fits. With "as much as memory allows" every profile fills the device; the split shows the trade."""

from __future__ import annotations

from PySide6.QtWidgets import QGridLayout, QLabel, QVBoxLayout, QWidget

from app.formatting import human_gib, human_memory, human_tokens, weights_words
from app.profile_plans import ProfilePlan
from app.widgets import clear_layout, label

# narrow enough for the smallest window (800 px): the profile's name says how many requests run together
HEADERS = ("Profile", "Weights", "Context each", "KV cache", "State", "Workspace", "")


class ProfileTable(QWidget):
    def __init__(self, descriptions: dict[str, dict], parent=None):
        super().__init__(parent)
        self.descriptions = descriptions
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(8)
        self.grid = QGridLayout()
        self.grid.setHorizontalSpacing(16)
        self.grid.setVerticalSpacing(6)
        self.note = label("", "muted", wrap=True)
        column.addLayout(self.grid)
        column.addWidget(self.note)

    def show_empty(self, text: str) -> None:
        self._clear()
        self.note.setText(text)

    def show_plans(self, plans: list[ProfilePlan], selected: str, note: str) -> None:
        self._clear()
        for col, title in enumerate(HEADERS):
            self.grid.addWidget(label(title, "tableHeader"), 0, col)
        for row, plan in enumerate(plans, start=1):
            self._row(row, plan, plan.profile == selected)
        self.note.setText(note)

    def cell_text(self, row: int, col: int) -> str:
        item = self.grid.itemAtPosition(row, col)
        cell = item.widget() if item is not None else None
        return cell.text() if isinstance(cell, QLabel) else ""

    def _clear(self) -> None:
        clear_layout(self.grid)

    def _row(self, row: int, plan: ProfilePlan, selected: bool) -> None:
        cells = (f"{plan.profile}  {self.descriptions[plan.profile]['title']}",
                 f"{weights_words(plan.weights, plan.weight_bits)}, {human_memory(plan.weights_bytes)}"
                 if plan.weights_bytes else "–",        # no plan at all (a device this machine lacks)
                 f"{human_tokens(plan.max_context)} tokens" if plan.fits else "does not fit",
                 *((human_memory(n) if plan.fits else "–") for n in (plan.kv_bytes, plan.state_bytes,
                                                                 plan.workspace_bytes)),
                 "✓ fits" if plan.fits else "✗")
        for col, text in enumerate(cells):
            cell = label(text, "tableCellStrong" if selected else "tableCell")
            if col == len(cells) - 1:
                cell.setProperty("fits", plan.fits)
            if not plan.fits and plan.message:
                cell.setToolTip(f"Does not fit: {plan.limit}. {plan.message}" if plan.limit else plan.message)
            elif plan.vision != "off" and col == (len(cells) - 2 if plan.vision == "on_demand" else 2):
                where = "on the GPU only while encoding" if plan.vision == "on_demand" else "kept on the GPU"
                cell.setToolTip(f"Includes the vision tower ({where}): {human_gib(plan.vision_bytes)} to encode the "
                                f"largest image")
            elif plan.total_bytes:
                cell.setToolTip(f"{human_gib(plan.total_bytes)} in all of {human_gib(plan.budget_bytes)} available")
            self.grid.addWidget(cell, row, col)
