"""How a layout is said: the one text form every screen and message uses (issue 37.4). Apart
from strategy.py (which loads the settings models) so that the status screens and the providers'
process can say a layout without them."""
from __future__ import annotations

from typing import Any, Mapping


def layout_text(layout: Mapping[str, Any], detail: bool = False) -> str:
    """A layout in words, the one form every screen and message uses: `tp 8 x pp 1 (ep 8, dp 1)`,
    with DP attention, an all-to-all backend and the node count when they apply. `detail` adds
    what the sizes make of the groups: `; attention tp 8, MoE tp 1, all-to-all none`. `layout`:
    Layout.as_dict(), or a server's own report of it (/server_info)."""
    parts = [f"ep {layout.get('ep_size')}", f"dp {layout.get('dp_size')}"]
    if layout.get("enable_dp_attention"):
        parts.append("dp-attention")
    a2a = layout.get("moe_a2a_backend")
    if a2a not in (None, "none") and not detail:
        parts.append(f"all-to-all {a2a}")
    if int(layout.get("nnodes") or 1) > 1:
        parts.append(f"{layout.get('nnodes')} nodes")
    text = f"tp {layout.get('tp_size')} x pp {layout.get('pp_size')} ({', '.join(parts)}"
    if detail:
        text += (f"; attention tp {layout.get('attn_tp_size')}, MoE tp {layout.get('moe_tp_size')}, "
                 f"all-to-all {layout.get('moe_a2a_backend')}")
    return text + ")"
