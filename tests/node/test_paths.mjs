// Where the node tests find what they run: the exlagent binary (EXLAGENT_BIN, default
// build/exlagent in the source tree), the shared test assets (EXL_SHARED_DIR, default ../shared
// beside the source tree) and the source tree itself; `missing` is a test's skip reason.
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const sourceDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const bin = process.env.EXLAGENT_BIN ?? path.join(sourceDir, 'build/exlagent');
export const shared = process.env.EXL_SHARED_DIR ?? path.join(sourceDir, '../shared');
export const storiesModel = path.join(shared, 'models/stories260K-hf');

// false when the binary and every one of `files` exist; otherwise the reason to skip, naming
// what is absent.
export function missing(...files) {
  const absent = [bin, ...files].filter((f) => !existsSync(f));
  return absent.length ? `missing ${absent.join(', ')}` : false;
}
