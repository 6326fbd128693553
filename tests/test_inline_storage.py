"""IR nodes keep their operands (up to 3), result shapes (1), dimensions (rank <= 6) and attribute
lists (1) inline, and spill to the heap beyond (csrc/util/small_vec.h, issue #12). These cases sit on
both sides of each inline size, and compare with eager on the CPU."""
import torch
import torch_xla
import torch_xla.core.xla_model as xm


def _dev():
    return torch_xla.device()


def test_ranks_around_the_inline_limit_match_eager():
    d = _dev()
    for rank in (0, 1, 5, 6, 7, 8):
        shape = tuple(2 + (i % 2) for i in range(rank))
        a = torch.randn(shape)
        b = torch.randn(shape[1:] if rank > 1 else shape)
        x = a.to(d)
        y = b.to(d)
        out = (x * 2 + y).exp().sum(dim=tuple(range(0, rank, 2)) if rank else None)
        ref = (a * 2 + b).exp().sum(dim=tuple(range(0, rank, 2)) if rank else None)
        torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
        if rank >= 2:
            perm = tuple(reversed(range(rank)))
            p = x.permute(perm).contiguous().reshape(-1, shape[0])
            torch.testing.assert_close(p.cpu(), a.permute(perm).contiguous().reshape(-1, shape[0]))
            u = x.unsqueeze(0).expand(3, *shape).flip(0, rank).narrow(rank, 0, 1)
            torch.testing.assert_close(u.cpu(), a.unsqueeze(0).expand(3, *shape).flip(0, rank).narrow(rank, 0, 1))


def test_many_operands_and_several_attribute_lists_match_eager():
    d = _dev()
    parts = [torch.randn(2, i + 1) for i in range(9)]  # concatenate: 9 operands
    out = torch.cat([p.to(d) for p in parts], dim=1)
    torch.testing.assert_close(out.cpu(), torch.cat(parts, dim=1))
    a = torch.randn(4, 5, 6, 7)
    x = a.to(d)
    # slice (start/limit/strides lists), pad (low/high/interior), reduce_window (five lists)
    s = x[1:4:2, ::2, 1:, ::3]
    torch.testing.assert_close(s.cpu(), a[1:4:2, ::2, 1:, ::3])
    pd = torch.nn.functional.pad(x, (1, 2, 0, 1), value=0.5)
    torch.testing.assert_close(pd.cpu(), torch.nn.functional.pad(a, (1, 2, 0, 1), value=0.5))
    mp = torch.nn.functional.max_pool2d(x, 3, stride=2, padding=1)
    torch.testing.assert_close(mp.cpu(), torch.nn.functional.max_pool2d(a, 3, stride=2, padding=1))
    # a multi-output node (sort: values and indices)
    v, i = torch.sort(x, dim=2)
    rv, ri = torch.sort(a, dim=2)
    torch.testing.assert_close(v.cpu(), rv)
    torch.testing.assert_close(i.cpu(), ri)


def test_a_graph_synced_twice_in_a_row_reuses_buffers_and_matches_eager():
    # The sync hands its post-order buffers to the next one; several outputs of one node are roots.
    d = _dev()
    a = torch.randn(6, 5)
    for _ in range(3):
        x = a.to(d)
        v, i = torch.max(x, dim=1)
        w = v * 2
        xm.mark_step()
        rv, ri = torch.max(a, dim=1)
        torch.testing.assert_close(v.cpu(), rv)
        torch.testing.assert_close(i.cpu(), ri)
        torch.testing.assert_close(w.cpu(), rv * 2)
