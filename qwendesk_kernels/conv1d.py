"""Depthwise causal conv1d (+ SiLU) over packed variable-length sequences with per-sequence state.

Layouts: x [T, C] (sequences packed back to back, cu_seqlens [N+1]; rows may be strided, e.g. a
column slice of the fused input projection); weight [C, W]; state pool [num_slots, W-1, C] holding
the last W-1 inputs of each sequence; slots [N]. A sequence whose `has_state` is False starts from
zeros (its slot is not read, only written). Slots of one batch must be distinct.

Two GPU paths: `causal_conv1d` for prefill (any lengths) and `causal_conv1d_update` for decode /
speculative verify (the same number L of tokens per sequence, CUDA-graph capturable). The
`conv_*` jit helpers are shared with the fused GDN decode kernel (qwendesk_kernels/gdn.py).
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


def causal_conv1d_ref(x, weight, state, slots, cu_seqlens, has_state, activation=True):
    """Returns y [T, C]; writes each sequence's last W-1 inputs into state[slots[i]]."""
    W = weight.shape[1]
    out = torch.empty_like(x)
    bounds = cu_seqlens.tolist()
    for i, slot in enumerate(slots.tolist()):
        s, e = bounds[i], bounds[i + 1]
        prev = state[slot].to(x.dtype) if bool(has_state[i]) else x.new_zeros(W - 1, x.shape[1])
        seq = torch.cat([prev, x[s:e]], dim=0)                       # [W-1+L, C]
        y = F.conv1d(seq.T.unsqueeze(0).to(weight.dtype), weight.unsqueeze(1), groups=x.shape[1])[0].T
        out[s:e] = (F.silu(y) if activation else y).to(x.dtype)
        state[slot] = seq[-(W - 1):].to(state.dtype)
    return out


def causal_conv1d_update_ref(x, weight, state, slots, has_state, step_states=None, activation=True):
    """Decode / verify: x [B*L, C] holds L tokens of each of the B sequences. step_states, if given
    ([B, L, W-1, C]), receives each sequence's window after each of its tokens."""
    B = slots.shape[0]
    L = x.shape[0] // B
    if step_states is None:
        cu = torch.arange(B + 1, dtype=torch.int32, device=x.device) * L
        return causal_conv1d_ref(x, weight, state, slots, cu, has_state, activation)
    out = torch.empty_like(x)
    one_each = torch.arange(B + 1, dtype=torch.int32, device=x.device)
    for t in range(L):
        rows = torch.arange(B, device=x.device) * L + t
        live = has_state if t == 0 else torch.ones_like(has_state)
        out[rows] = causal_conv1d_ref(x[rows], weight, state, slots, one_each, live, activation)
        step_states[:, t] = state[slots]
    return out


# ---------------------------------------------------------------- decode helpers (shared with gdn.py)

@triton.jit
def conv_input(x_ptr, x_row_stride, win_ptr, win_row_stride, cols, mask, live, p: tl.constexpr, W: tl.constexpr):
    """fp32 input at position p of this step: row p of x, or (p < 0) row W-1+p of the saved window
    (zeros when the sequence has no state)."""
    if p < 0:
        val = tl.load(win_ptr + (W - 1 + p) * win_row_stride + cols, mask=tl.where(live, mask, False), other=0.0)
    else:
        val = tl.load(x_ptr + p * x_row_stride + cols, mask=mask, other=0.0)
    return val.to(tl.float32)


@triton.jit
def conv_token(x_ptr, x_row_stride, win_ptr, win_row_stride, w_ptr, cols, mask, live,
               t: tl.constexpr, W: tl.constexpr, ACTIVATION: tl.constexpr):
    """fp32 conv output of token t of this step for channels `cols` (weight [C, W] at w_ptr)."""
    acc = conv_input(x_ptr, x_row_stride, win_ptr, win_row_stride, cols, mask, live, t + 1 - W, W) \
        * tl.load(w_ptr + cols * W, mask=mask, other=0.0).to(tl.float32)
    for j in tl.static_range(1, W):
        acc += conv_input(x_ptr, x_row_stride, win_ptr, win_row_stride, cols, mask, live, t + 1 - W + j, W) \
            * tl.load(w_ptr + cols * W + j, mask=mask, other=0.0).to(tl.float32)
    if ACTIVATION:
        acc = acc * tl.sigmoid(acc)
    return acc


@triton.jit
def store_conv_window(x_ptr, x_row_stride, win_ptr, win_row_stride, dst_ptr, dst_row_stride, cols, mask, live,
                      t: tl.constexpr, W: tl.constexpr):
    """Write the window after token t (inputs t-W+2 .. t) into dst rows 0..W-2. dst may be the saved
    window itself: row i reads old row t+1+i > i, which is not yet overwritten (same thread, same column)."""
    for i in tl.static_range(W - 1):
        val = conv_input(x_ptr, x_row_stride, win_ptr, win_row_stride, cols, mask, live, t + 2 - W + i, W)
        tl.store(dst_ptr + i * dst_row_stride + cols, val.to(dst_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------- prefill (varlen)

@triton.jit
def _conv_varlen_kernel(x, x_row_stride, w, state, state_slot_stride, state_row_stride, slots, has_state,
                        cu_seqlens, y, y_row_stride, T, C, N,
                        W: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_N: tl.constexpr,
                        ACTIVATION: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    row_ok = rows < T
    col_ok = cols < C
    # sequence of each row = number of sequence ends at or before it
    seq_ids = tl.arange(0, BLOCK_N)
    ends = tl.load(cu_seqlens + 1 + seq_ids, mask=seq_ids < N, other=2147483647)
    seq = tl.sum((ends[None, :] <= rows[:, None]).to(tl.int32), axis=1)
    start = tl.load(cu_seqlens + seq, mask=row_ok, other=0)
    acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    for j in tl.static_range(W):
        src = rows + (j + 1 - W)                       # input row of tap j; before `start` it is in the window
        xv = tl.load(x + src.to(tl.int64)[:, None] * x_row_stride + cols[None, :],
                     mask=((src >= start) & row_ok)[:, None] & col_ok[None, :], other=0.0)
        acc += xv.to(tl.float32) * tl.load(w + cols * W + j, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    # Only tiles holding one of the first W-1 rows of a sequence read saved windows.
    if tl.min(tl.where(row_ok, rows - start, W), axis=0) < W - 1:
        slot = tl.load(slots + seq, mask=row_ok, other=0).to(tl.int64)
        live = tl.load(has_state + seq, mask=row_ok, other=0) != 0
        for j in tl.static_range(W - 1):
            src = rows + (j + 1 - W)
            sv = tl.load(state + slot[:, None] * state_slot_stride + (src - start + W - 1)[:, None] * state_row_stride
                         + cols[None, :], mask=((src < start) & live & row_ok)[:, None] & col_ok[None, :], other=0.0)
            acc += sv.to(tl.float32) * tl.load(w + cols * W + j, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if ACTIVATION:
        acc = acc * tl.sigmoid(acc)
    tl.store(y + rows.to(tl.int64)[:, None] * y_row_stride + cols[None, :], acc.to(y.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _conv_final_state_kernel(x, x_row_stride, state, state_slot_stride, state_row_stride, slots, has_state,
                             cu_seqlens, C, W: tl.constexpr, BLOCK_C: tl.constexpr):
    """Runs after _conv_varlen_kernel (which reads the old windows): new window = last W-1 inputs."""
    n = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < C
    start = tl.load(cu_seqlens + n)
    end = tl.load(cu_seqlens + n + 1)
    live = tl.load(has_state + n) != 0
    win = state + tl.load(slots + n).to(tl.int64) * state_slot_stride + cols
    for i in tl.static_range(W - 1):
        src = end - (W - 1) + i                        # row i reads old row len+i >= i: not yet overwritten
        xv = tl.load(x + src.to(tl.int64) * x_row_stride + cols, mask=tl.where(src >= start, col_ok, False), other=0.0)
        sv = tl.load(win + (src - start + W - 1) * state_row_stride, mask=tl.where((src < start) & live, col_ok, False),
                     other=0.0)
        val = tl.where(src >= start, xv.to(tl.float32), sv.to(tl.float32))
        tl.store(win + i * state_row_stride, val.to(state.dtype.element_ty), mask=col_ok)


def causal_conv1d_triton(x, weight, state, slots, cu_seqlens, has_state, activation=True):
    """Triton version of causal_conv1d_ref (same arguments and effects)."""
    T, C = x.shape
    N, W = slots.shape[0], weight.shape[1]
    assert x.stride(1) == 1 and state.stride(2) == 1 and weight.is_contiguous()
    y = torch.empty((T, C), dtype=x.dtype, device=x.device)
    live = has_state.view(torch.uint8)
    block_t, block_c = 32, 128
    if T:
        _conv_varlen_kernel[(triton.cdiv(T, block_t), triton.cdiv(C, block_c))](
            x, x.stride(0), weight, state, state.stride(0), state.stride(1), slots, live, cu_seqlens, y, y.stride(0),
            T, C, N, W=W, BLOCK_T=block_t, BLOCK_C=block_c, BLOCK_N=max(16, triton.next_power_of_2(N)),
            ACTIVATION=activation, num_warps=8)
    _conv_final_state_kernel[(N, triton.cdiv(C, 256))](
        x, x.stride(0), state, state.stride(0), state.stride(1), slots, live, cu_seqlens, C,
        W=W, BLOCK_C=256, num_warps=2)
    return y


def causal_conv1d(x, weight, state, slots, cu_seqlens, has_state, activation=True):
    """Prefill conv: Triton on CUDA, the torch reference elsewhere."""
    if x.is_cuda:
        return causal_conv1d_triton(x, weight, state, slots, cu_seqlens, has_state, activation)
    return causal_conv1d_ref(x, weight, state, slots, cu_seqlens, has_state, activation)


# ---------------------------------------------------------------- decode / verify (L tokens per sequence)

@triton.jit
def _conv_update_kernel(x, x_row_stride, w, state, state_slot_stride, state_row_stride, slots, has_state,
                        y, y_row_stride, steps, C,
                        L: tl.constexpr, W: tl.constexpr, BLOCK_C: tl.constexpr, ACTIVATION: tl.constexpr,
                        STORE_STEPS: tl.constexpr):
    b = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = cols < C
    live = tl.load(has_state + b) != 0
    win = state + tl.load(slots + b).to(tl.int64) * state_slot_stride
    x_rows = x + b.to(tl.int64) * L * x_row_stride
    for t in tl.static_range(L):
        row = b.to(tl.int64) * L + t
        out = conv_token(x_rows, x_row_stride, win, state_row_stride, w, cols, mask, live, t, W, ACTIVATION)
        tl.store(y + row * y_row_stride + cols, out.to(y.dtype.element_ty), mask=mask)
        if STORE_STEPS:
            store_conv_window(x_rows, x_row_stride, win, state_row_stride, steps + row * (W - 1) * C, C, cols, mask,
                              live, t, W)
    store_conv_window(x_rows, x_row_stride, win, state_row_stride, win, state_row_stride, cols, mask, live, L - 1, W)


def causal_conv1d_update_triton(x, weight, state, slots, has_state, step_states=None, activation=True):
    """Triton version of causal_conv1d_update_ref; grid (B, C/256), graph capturable."""
    T, C = x.shape
    B, W = slots.shape[0], weight.shape[1]
    assert x.stride(1) == 1 and state.stride(2) == 1 and weight.is_contiguous()
    assert step_states is None or step_states.is_contiguous()
    y = torch.empty((T, C), dtype=x.dtype, device=x.device)
    block_c = 256
    _conv_update_kernel[(B, triton.cdiv(C, block_c))](
        x, x.stride(0), weight, state, state.stride(0), state.stride(1), slots, has_state.view(torch.uint8),
        y, y.stride(0), step_states if step_states is not None else y, C,
        L=T // B, W=W, BLOCK_C=block_c, ACTIVATION=activation, STORE_STEPS=step_states is not None, num_warps=2)
    return y


def causal_conv1d_update(x, weight, state, slots, has_state, step_states=None, activation=True):
    """Decode / verify conv (L = x.shape[0] // len(slots) tokens per sequence): Triton on CUDA, else the reference."""
    if x.is_cuda:
        return causal_conv1d_update_triton(x, weight, state, slots, has_state, step_states, activation)
    return causal_conv1d_update_ref(x, weight, state, slots, has_state, step_states, activation)
