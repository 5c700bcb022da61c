# Type stubs of the extension module (python/src/lib.rs). Tensors travel as (address, elements):
# host tensors' elements are the array's, device tensors' those from the address to the end of
# the tensor's storage. Private: the Python layer in _interface.py is the API.

from typing import Dict, Mapping, Optional, Tuple

HostTensor = Tuple[int, int]
DeviceTensor = Tuple[int, int]

LIBRARY_VERSION: str

class Problem:
    def __init__(
        self,
        dtype: str,
        batch: int,
        seq_q: int,
        seq_kv: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        causal: bool = False,
        scale: Optional[float] = None,
        window: Optional[Tuple[Optional[int], Optional[int]]] = None,
        softcap: Optional[float] = None,
        alibi: bool = False,
        dropout: Optional[Tuple[float, int]] = None,
        varlen: Optional[Tuple[int, int]] = None,
        paged: Optional[Tuple[int, int, int]] = None,
        kv_lengths: bool = False,
        layouts: Optional[Mapping[str, Tuple[int, int, int, int]]] = None,
    ) -> None: ...
    def required_len(self, tensor: str) -> int: ...
    @property
    def lse_len(self) -> int: ...
    @property
    def softmax_scale(self) -> float: ...

def dropout_mask(p: float, seed: int, batch: int, num_heads: int, seq_q: int, seq_kv: int) -> bytes: ...
def wgpu_forward(
    problem: Problem,
    q: HostTensor,
    k: HostTensor,
    v: HostTensor,
    o: HostTensor,
    lse: Optional[HostTensor] = None,
    *,
    cu_seqlens_q: Optional[HostTensor] = None,
    cu_seqlens_k: Optional[HostTensor] = None,
    page_table: Optional[HostTensor] = None,
    kv_lens: Optional[HostTensor] = None,
    alibi_slopes: Optional[HostTensor] = None,
) -> str: ...
def wgpu_backward(
    problem: Problem,
    q: HostTensor,
    k: HostTensor,
    v: HostTensor,
    o: HostTensor,
    lse: HostTensor,
    d_o: HostTensor,
    dq: HostTensor,
    dk: HostTensor,
    dv: HostTensor,
    *,
    cu_seqlens_q: Optional[HostTensor] = None,
    cu_seqlens_k: Optional[HostTensor] = None,
    alibi_slopes: Optional[HostTensor] = None,
) -> str: ...
def wgpu_adapter() -> Dict[str, str]: ...
def cuda_forward(
    problem: Problem,
    device: int,
    stream: int,
    q: DeviceTensor,
    k: DeviceTensor,
    v: DeviceTensor,
    o: DeviceTensor,
    lse: Optional[DeviceTensor] = None,
    *,
    cu_seqlens_q: Optional[DeviceTensor] = None,
    cu_seqlens_k: Optional[DeviceTensor] = None,
    page_table: Optional[DeviceTensor] = None,
    kv_lens: Optional[DeviceTensor] = None,
    alibi_slopes: Optional[DeviceTensor] = None,
) -> Tuple[str, Dict[str, int]]: ...
def cuda_backward(
    problem: Problem,
    device: int,
    stream: int,
    q: DeviceTensor,
    k: DeviceTensor,
    v: DeviceTensor,
    o: DeviceTensor,
    lse: DeviceTensor,
    d_o: DeviceTensor,
    dq: DeviceTensor,
    dk: DeviceTensor,
    dv: DeviceTensor,
    *,
    deterministic: bool = False,
) -> Tuple[str, Dict[str, int]]: ...
def cuda_append_kv(
    problem: Problem,
    device: int,
    stream: int,
    new_k: DeviceTensor,
    new_v: DeviceTensor,
    k_cache: DeviceTensor,
    v_cache: DeviceTensor,
    *,
    page_table: Optional[DeviceTensor] = None,
    kv_lens: Optional[DeviceTensor] = None,
) -> None: ...
def cuda_libraries() -> Tuple[bool, bool]: ...
def cuda_bench_direct(problem: Problem, device: int = 0, iters: int = 20, warmup: int = 3) -> Tuple[float, str]: ...
