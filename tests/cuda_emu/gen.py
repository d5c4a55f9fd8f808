# Rewrites a .cu file for tests/cuda_emu: kernel<<<grid, block, smem, stream>>>(args) becomes
# emu::launch(...), and extern __shared__ arrays point at the emulated dynamic shared memory.
import re, sys, pathlib
src = pathlib.Path(sys.argv[1]); out = pathlib.Path(sys.argv[2])
s = src.read_text()
s = re.sub(r'extern __shared__ (\w+) (\w+)\[\];', r'\1* \2 = reinterpret_cast<\1*>(::emu::dyn_smem);', s)
def repl(m):
    k, cfg, args = m.group(1), m.group(2), m.group(3)
    parts = [p.strip() for p in re.split(r',(?![^()]*\))', cfg)]
    while len(parts) < 4: parts.append('0')
    g, b, sm, st = parts[:4]
    return f'::emu::launch(reinterpret_cast<const void*>(&{k}), dim3({g}), dim3({b}), {sm}, [&] {{ {k}({args}); }});'
s, n = re.subn(r'([\w:]+(?:<[^<>;]*>)?)<<<(.*?)>>>\((.*)\);', repl, s)
s = '#include "emu.h"\n' + s
out.write_text(s)
print(src.name, n, 'launches', file=sys.stderr)
