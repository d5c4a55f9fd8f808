# Rewrites a .cu file (or a .cuh device header) for tests/cuda_emu:
# - kernel<<<grid, block, smem, stream>>>(args) becomes the expression ::emu::launch(...), its
#   arguments captured by value (as CUDA copies kernel parameters at launch or graph capture);
# - extern __shared__ arrays point at the emulated dynamic shared memory;
# - each inline PTX statement asm [volatile]("op a, b, ..." : outputs : inputs [: clobbers]) becomes
#   ::emu::asm_<op with '.' as '_'>(operands in template order): outputs as lvalues, {v0, v1} lists
#   flattened, [addr] as the address, immediates as written. emu.h defines those functions; an
#   instruction it lacks is a compile error that names it. One instruction under a predicate,
#   "{ .reg .pred p; setp.ne.b32 p, %K, 0; @p op ...; }", becomes if (operand K != 0) op(...).
import re, sys, pathlib

src = pathlib.Path(sys.argv[1]); out = pathlib.Path(sys.argv[2])
s = src.read_text()
s = re.sub(r'extern __shared__ (\w+) (\w+)\[\];', r'\1* \2 = reinterpret_cast<\1*>(::emu::dyn_smem);', s)


def drop_sm90a(t):
    """Drops the sm_90a-only regions (#if defined(__CUDA_ARCH_FEAT_SM90_ALL) .. #else/#endif): the
    emulator is not that architecture, and their PTX (wgmma) has no emulation."""
    lines, out, stack = t.split('\n'), [], []  # stack: per open #if, whether its lines are dropped
    for line in lines:
        d = line.strip()
        if d.startswith('#if'):
            stack.append(d == '#if defined(__CUDA_ARCH_FEAT_SM90_ALL)')
            if stack[-1]:
                continue
        elif d.startswith('#else') and stack:
            if stack[-1]:
                stack[-1] = 'else'
                continue
        elif d.startswith('#endif') and stack:
            if stack.pop():
                continue
        if any(x is True for x in stack):
            continue
        out.append(line)
    return '\n'.join(out)


s = drop_sm90a(s)


def fail(msg):
    sys.exit(f'{src.name}: gen.py: {msg}')


def skip_string(t, i):
    q = t[i]
    i += 1
    while t[i] != q:
        i += 2 if t[i] == '\\' else 1
    return i + 1


def close_paren(t, i):
    """Index just past the bracket group opening at t[i] ((, [ or {), skipping strings."""
    pairs = {'(': ')', '[': ']', '{': '}'}
    stack = [pairs[t[i]]]
    i += 1
    while stack:
        c = t[i]
        if c in '"\'':
            i = skip_string(t, i)
            continue
        if c in pairs:
            stack.append(pairs[c])
        elif c in ')]}':
            if c != stack.pop():
                fail(f'unbalanced {c!r} near: {t[max(0, i - 60):i + 20]!r}')
        i += 1
    return i


def split_top(t, sep):
    parts, depth, start, i = [], 0, 0, 0
    while i < len(t):
        c = t[i]
        if c in '"\'':
            i = skip_string(t, i)
            continue
        if c in '([{':
            depth += 1
        elif c in ')]}':
            depth -= 1
        elif c == sep and depth == 0:
            parts.append(t[start:i])
            start = i + 1
        i += 1
    parts.append(t[start:])
    return parts


# ---- launches ----
def kernel_start(t, end):
    """Start of the kernel expression (name with optional template arguments) ending at t[end]."""
    i = end
    if t[i - 1] == '>':
        depth, i = 0, i - 1
        while True:
            c = t[i]
            if c in ')]':
                depth_p, j = 1, i - 1
                while depth_p:
                    depth_p += {')': 1, ']': 1, '(': -1, '[': -1}.get(t[j], 0)
                    j -= 1
                i = j
                continue
            if c == '>':
                depth += 1
            elif c == '<':
                depth -= 1
                if depth == 0:
                    break
            i -= 1
    while i > 0 and (t[i - 1].isalnum() or t[i - 1] in '_:'):
        i -= 1
    return i


res, pos, n_launch = [], 0, 0
while True:
    k = s.find('<<<', pos)
    if k < 0:
        break
    ks = kernel_start(s, k)
    e = s.find('>>>', k)
    cfg = s[k + 3:e]
    a = e + 3
    while s[a].isspace():
        a += 1
    if s[a] != '(':
        fail(f'launch without arguments near: {s[ks:a + 20]!r}')
    ae = close_paren(s, a)
    kern, args = s[ks:k], s[a + 1:ae - 1]
    parts = [p.strip() for p in split_top(cfg, ',')]
    while len(parts) < 4:
        parts.append('0')
    g, b, sm, _ = parts[:4]
    res.append(s[pos:ks])
    key = 'nullptr' if sm == '0' else f'::emu::fn_key({kern})'  # an overloaded kernel has no single address
    name = ' '.join(kern.split()).replace('"', "'")
    res.append(f'::emu::launch({key}, "{name}", dim3({g}), dim3({b}), {sm}, [=] {{ {kern}({args}); }})')
    pos = ae
    n_launch += 1
res.append(s[pos:])
s = ''.join(res)

# ---- inline PTX ----
res, pos, n_asm = [], 0, 0
for m in re.finditer(r'\basm\s*(?:volatile\s*)?\(', s):
    if m.start() < pos:
        continue
    op_at = m.end() - 1
    end = close_paren(s, op_at)
    body = s[op_at + 1:end - 1]
    sections = split_top(body, ':')
    templ = ''.join(re.findall(r'"((?:[^"\\]|\\.)*)"', sections[0]))
    def operands(sec):
        out = []
        for p in split_top(sec, ','):
            p = p.strip()
            if not p:
                continue
            mm = re.fullmatch(r'"([=+&]*)(\w+)"\s*\((.*)\)', p, re.S)
            if not mm:
                fail(f'asm operand not understood: {p!r}')
            out.append(mm.group(3).strip())
        return out
    ops = operands(sections[1]) if len(sections) > 1 else []
    ops += operands(sections[2]) if len(sections) > 2 else []
    insns = [x.strip() for x in templ.split(';') if x.strip()]
    # One instruction under a predicate set from an operand:
    # "{ .reg .pred p; setp.ne.b32 p, %K, 0; @p op ...; }" becomes if ((operand K) != 0) op(...).
    guard = None
    t = templ.replace('\\n', ' ').strip()
    if t.startswith('{') and t.endswith('}'):
        parts = [x.strip() for x in t[1:-1].split(';') if x.strip() and not x.strip().startswith('.reg')]
        g = re.fullmatch(r'setp\.ne\.b32\s+p\s*,\s*%(\d+)\s*,\s*0', parts[0]) if len(parts) == 2 else None
        if not g or not parts[1].startswith('@p ') or int(g.group(1)) >= len(ops):
            fail(f'asm block not understood (one predicated instruction expected): {templ!r}')
        guard = ops[int(g.group(1))]
        insns = [parts[1][3:].strip()]
    if len(insns) != 1:
        fail(f'asm with {len(insns)} instructions (one expected): {templ!r}')
    mm = re.fullmatch(r'([\w.:]+)\s*(.*)', insns[0], re.S)
    opcode, rest = mm.group(1), mm.group(2)
    args = []
    for o in split_top(rest, ','):
        o = o.strip()
        if not o:
            continue
        for x in (split_top(o[1:-1], ',') if o.startswith('{') else [o[1:-1]] if o.startswith('[') else [o]):
            x = x.strip()
            r = re.fullmatch(r'%(\d+)', x)
            if r:
                idx = int(r.group(1))
                if idx >= len(ops):
                    fail(f'%{idx} out of range in {templ!r}')
                args.append(f'({ops[idx]})')
            elif re.fullmatch(r'-?(0x[0-9a-fA-F]+|\d+)', x):
                args.append(x + 'u' if not x.startswith('-') else x)
            else:
                fail(f'asm operand {x!r} not understood in {templ!r}')
    res.append(s[pos:m.start()])
    call = f'::emu::asm_{opcode.replace(".", "_").replace(":", "_")}({", ".join(args)})'
    res.append(f'if (({guard}) != 0) {call}' if guard is not None else call)
    pos = end
    n_asm += 1
res.append(s[pos:])
s = '#include "emu.h"\n' + ''.join(res)
out.write_text(s)
print(src.name, n_launch, 'launches,', n_asm, 'asm statements', file=sys.stderr)
