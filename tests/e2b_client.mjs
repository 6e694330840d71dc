// E2B JS SDK user code, unchanged: run by tests/test_e2b.py under Node with
// a pinned npm `e2b` and only E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY
// pointing at Warren. The JS SDK insists on Connect's end-of-stream frame.
import { Sandbox } from 'e2b'
import assert from 'node:assert/strict'

const sbx = await Sandbox.create('base', { timeoutMs: 120_000, metadata: { k: 'v' }, envs: { FOO: 'js' } })
try {
  const r = await sbx.commands.run('echo hi; echo err >&2; echo $FOO')
  assert.equal(r.stdout, 'hi\njs\n')
  assert.equal(r.stderr, 'err\n')
  assert.equal(r.exitCode, 0)
  await assert.rejects(sbx.commands.run('exit 4'), (e) => e.exitCode === 4)
  await sbx.files.write('/tmp/js/a.txt', 'from node')
  assert.equal(await sbx.files.read('/tmp/js/a.txt'), 'from node')
  const names = (await sbx.files.list('/tmp/js')).map((e) => e.name)
  assert.deepEqual(names, ['a.txt'])
  // watchDir: the WatchDir stream.
  const seen = []
  const watch = await sbx.files.watchDir('/tmp/js', (e) => { seen.push(`${e.type}:${e.name}`) })
  await sbx.files.write('/tmp/js/b.txt', 'x')
  await sbx.commands.run('rm /tmp/js/b.txt')
  for (let i = 0; i < 75 && !seen.includes('remove:b.txt'); i++) await new Promise((r) => setTimeout(r, 200))
  for (const want of ['create:b.txt', 'write:b.txt', 'remove:b.txt']) assert.ok(seen.includes(want), `${want} in ${seen}`)
  await watch.stop()
  await sbx.setTimeout(300_000)
  const page = await Sandbox.list().nextItems()
  assert.ok(page.some((s) => s.sandboxId === sbx.sandboxId))
  const h = await sbx.commands.run('sleep 30', { background: true })
  assert.equal(await sbx.commands.kill(h.pid), true)
} finally {
  await sbx.kill()
}
assert.equal(await sbx.isRunning(), false)
console.log('node ok')
