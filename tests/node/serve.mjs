// Starts `exlagent serve` for a node test: spawns `bin` with `args` (which should hold
// `--port 0`) and resolves, once the server has printed the address it listens on, to
// { server: the child process, port }. Rejects with the server's stderr if it exits first.
import { spawn } from 'node:child_process';

export function startServe(bin, args) {
  const server = spawn(bin, ['serve', ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
  return new Promise((resolve, reject) => {
    let err = '';
    server.stderr.on('data', (d) => {
      err += d;
      const m = err.match(/on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) resolve({ server, port: Number(m[1]) });
    });
    server.on('exit', (code) => reject(new Error(`server exited (${code}): ${err}`)));
  });
}
