"""Which in-place ops refuse an operand that overlaps the written-to tensor, on eager CPU and on XLA.

Enumerates every aten in-place overload (a written `self` and at least one other tensor operand),
calls it with small arguments on eager CPU and on `torch_xla.device()`, with one tensor operand
partially overlapping `self` (`base[:4]` written from `base[1:5]`) and equal to `self`, and prints
the overloads whose outcome (raises eager's "single memory location" error, runs, or another
error) differs between the two. csrc/bridge/inplace_overlap.cc's lists come from this.

    .venv/bin/python scripts/enum_inplace_overlap.py [--json out.json]
"""
import argparse, json, sys, warnings
import torch
import torch_xla
warnings.filterwarnings('ignore')
DEV = 'cpu'
CUR = ['']
OVL = ('single memory location', 'more than one element of the written-to tensor')
def gen_ops():
    out = []
    for s in torch._C._jit_get_all_schemas():
        if not s.name.startswith('aten::'): continue
        name = s.name[6:]
        if not name.endswith('_') or name.startswith('_foreach') or name.endswith('__'): pass
        if not s.arguments or s.arguments[0].name != 'self': continue
        a0 = s.arguments[0]
        if a0.alias_info is None or not a0.alias_info.is_write: continue
        if any(a.kwarg_only and a.name == 'out' for a in s.arguments): continue
        if not name.endswith('_'): continue
        tens = [a for a in s.arguments[1:] if str(a.type) in ('Tensor', 'Optional[Tensor]')]
        if not tens: continue
        out.append(s)
    return out
def mk(dtype, n=4):
    if dtype == torch.float32 and 'bernoulli' in CUR[0]: return torch.full((n,), 0.5)
    if dtype == torch.bool: return torch.tensor([True, False, True, True, False, True, False, True][:n])
    if dtype.is_floating_point: return torch.tensor([0.5, 1.5, 2.5, 0.25, 1.25, 3.0, 0.75, 2.0][:n], dtype=dtype)
    return torch.tensor([1, 2, 3, 4, 5, 6, 7, 1][:n], dtype=dtype)
MAT = {'addmm_': [(2,2),(2,2),(2,2)], 'addmv_': [(2,),(2,2),(2,)], 'addr_': [(2,2),(2,),(2,)],
       'baddbmm_': [(1,2,2),(1,2,2),(1,2,2)], 'addbmm_': [(2,2),(1,2,2),(1,2,2)]}
def build(s, dtype, k_over, mode):
    nm = s.name[6:]
    if nm in MAT:
        shp = MAT[nm]; base = mk(dtype, 8).to(DEV)
        import math as _m
        n = lambda sh: _m.prod(sh)
        self_ = base[:n(shp[0])].view(shp[0]) if mode != 'none' else mk(dtype, n(shp[0])).view(shp[0]).to(DEV)
        args = [self_]; j = 1
        for i, a in enumerate(s.arguments[1:], 1):
            if str(a.type) != 'Tensor': break
            sh = shp[j]; j += 1
            if i == k_over and mode == 'partial': v = base[1:1 + n(sh)].view(sh)
            elif i == k_over and mode == 'full':
                if sh != shp[0]: v = base[:n(sh)].view(sh)
                else: v = self_
            else: v = mk(dtype, n(sh)).view(sh).to(DEV)
            args.append(v)
        return args, {}
    base = mk(dtype, 8).to(DEV)
    self_ = base[:4] if mode != 'none' else mk(dtype, 4).to(DEV)
    args = [self_]; kwargs = {}
    for i, a in enumerate(s.arguments[1:], 1):
        t = str(a.type)
        if t in ('Tensor', 'Optional[Tensor]'):
            nm = a.name
            if i == k_over:
                if nm == 'value': v = base[1] if mode != 'none' else mk(dtype, 1)[0].to(DEV)
                elif mode == 'partial': v = base[1:5]
                elif mode == 'full': v = self_
                else: v = mk(dtype, 4).to(DEV)
            elif nm in ('index', 'indices'): v = torch.tensor([0, 1, 2, 3]).to(DEV)
            elif nm == 'value': v = mk(dtype, 1)[0].to(DEV)
            elif nm == 'p': v = torch.full((4,), 0.5, dtype=dtype).to(DEV)
            elif nm == 'mask': v = torch.tensor([True, False, True, False]).to(DEV)
            else: v = mk(dtype, 4).to(DEV)
            if a.kwarg_only: kwargs[a.name] = v
            else: args.append(v)
            continue
        if a.has_default_value(): break  # keep defaults for the rest (kw args after are skipped too)
        if t == 'int': v = 0
        elif t in ('Scalar',): v = 0.5 if s.name.endswith('lerp_') else 2
        elif t == 'float': v = 0.5
        elif t == 'bool': v = False
        elif t == 'List[int]': v = [0]
        elif t in ('Optional[List[Tensor]]', 'List[Optional[Tensor]]', 'List[Tensor]'): v = [torch.tensor([0, 1, 2, 3]).to(DEV)]
        elif t == 'str': v = 'prod' if 'index_reduce' in s.name else ('add' if s.name=='aten::scatter_' else 'sum')
        elif t == 'Optional[str]': v = 'floor'
        elif t == 'number': v = 0.5
        else: raise TypeError(t)
        if a.kwarg_only: kwargs[a.name] = v
        else: args.append(v)
    return args, kwargs
def call(s, args, kwargs):
    name, ov = s.name[6:], s.overload_name or 'default'
    op = getattr(getattr(torch.ops.aten, name), ov)
    try:
        op(*args, **kwargs)
        if not isinstance(DEV, str): torch_xla.sync()
        return 'ok'
    except Exception as e:
        m = str(e)
        return 'OVL' if any(o in m for o in OVL) else 'err:' + type(e).__name__
def survey():
    res = {}
    CUR[0] = ''
    for s in gen_ops():
        key = s.name[6:] + ('.' + s.overload_name if s.overload_name else '')
        CUR[0] = key
        for dtype in (torch.float32, torch.int64, torch.bool, torch.float64):
            try:
                ks = [i for i, a in enumerate(s.arguments[1:], 1) if str(a.type) in ('Tensor', 'Optional[Tensor]') and a.name not in ('index', 'indices', 'mask')]
                if not ks: break
                r0 = call(s, *build(s, dtype, ks[0], 'none'))
                if r0 != 'ok': continue
                out = {}
                for k in ks:
                    for mode in ('partial', 'full'):
                        out[f'{s.arguments[k].name}:{mode}'] = call(s, *build(s, dtype, k, mode))
                res[key] = {'dtype': str(dtype), **out}
                break
            except TypeError as e:
                res[key] = {'skip': str(e)}
                break
            except Exception as e:
                continue
        else:
            res[key] = {'skip': 'no dtype ran'}
    return res


def main():
    global DEV
    ap = argparse.ArgumentParser()
    ap.add_argument('--json', help='write both surveys here')
    a = ap.parse_args()
    DEV = 'cpu'
    cpu = survey()
    DEV = torch_xla.device()
    xla = survey()
    if a.json:
        json.dump({'cpu': cpu, 'xla': xla}, open(a.json, 'w'), indent=1)
    checked = [k for k, v in cpu.items() if 'skip' not in v]
    raising = [k for k in checked if 'OVL' in cpu[k].values()]
    diff = [k for k in cpu if cpu[k] != xla.get(k) and 'skip' not in cpu[k]]
    print(f'{len(cpu)} in-place overloads with a tensor operand, {len(checked)} called, '
          f'{len(raising)} raise on eager CPU, {len(diff)} differ on XLA')
    for k in diff:
        print(f'  {k}: eager {cpu[k]}\n  {" " * len(k)}  xla   {xla.get(k)}')
    return 1 if diff else 0


if __name__ == '__main__':
    sys.exit(main())
