"""engine/core/device.capture_graph: the engine captures a CUDA graph (a speculative round on its first use) while the
disk tier's writer thread waits on its copies' events. In CUDA's default capture mode that wait fails the capture
(the GPU soak hit it: `operation not permitted when stream is capturing`); captured thread-locally it does not."""

import threading

import pytest
import torch

from engine.core.device import capture_graph


def captures_beside_a_waiting_thread(capture, rounds: int = 40) -> int:
    """Capture and replay `rounds` graphs while another thread records and waits on events; the failures."""
    stop, failures = threading.Event(), 0
    side = torch.cuda.Stream()

    def writer():                          # what DiskCache._write_loop does per job
        while not stop.is_set():
            with torch.cuda.stream(side):
                event = torch.cuda.Event()
                event.record()
            try:
                event.synchronize()
            except RuntimeError:           # refused while a capture in the default mode runs
                pass

    thread = threading.Thread(target=writer, daemon=True)
    a = torch.randn(512, 512, device="cuda")
    a @ a + 1                              # cuBLAS initialised outside any capture, as the engine warms up
    torch.cuda.synchronize()
    thread.start()
    try:
        for _ in range(rounds):
            graph = torch.cuda.CUDAGraph()
            try:
                with capture(graph):
                    out = a @ a + 1
                graph.replay()
                torch.cuda.synchronize()
                assert torch.allclose(out, a @ a + 1)
            except RuntimeError:           # torch.AcceleratorError is one
                failures += 1
                torch.cuda.synchronize()
    finally:
        stop.set()
        thread.join()
    return failures


@pytest.mark.gpu
def test_a_capture_survives_another_thread_waiting_on_the_gpu():
    assert captures_beside_a_waiting_thread(capture_graph) == 0


@pytest.mark.gpu
def test_the_default_capture_mode_does_not():
    """The control: the thread above really does break a capture in CUDA's default mode."""
    assert captures_beside_a_waiting_thread(lambda g: torch.cuda.graph(g)) > 0
