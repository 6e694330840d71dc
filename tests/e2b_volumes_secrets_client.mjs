// E2B JS SDK user code for secrets and volumes, unchanged: run by
// tests/test_e2b.py under Node with a pinned npm `e2b`, E2B_VOLUME_API_URL
// set beside the usual three. Every body npm sends is chunked.
import { Secret, SecretNotFoundError, Volume, VolumeError, VolumePathNotFoundError } from 'e2b'
import assert from 'node:assert/strict'

const run = Math.random().toString(16).slice(2, 8)

// Secrets.
const a = await Secret.create(`js-${run}-a`, 'one', { metadata: { by: 'node' } })
const b = await Secret.create(`JS-${run}-b`, 'two')
assert.match(a.secretId, /^sec_/)
assert.equal(b.name, `js-${run}-b`)
assert.deepEqual([a.version, a.metadata, b.metadata], [1, { by: 'node' }, {}])
assert.ok(a.createdAt instanceof Date)
const pager = Secret.list({ limit: 1 })
const seen = []
while (pager.hasNext) seen.push(...(await pager.nextItems()))
assert.ok([a.secretId, b.secretId].every((id) => seen.some((s) => s.secretId === id)))
assert.equal((await Secret.update(b.name, 'three', { metadata: { v: '2' } })).version, 2)
assert.equal((await Secret.getInfo(b.secretId)).metadata.v, '2')
await assert.rejects(Secret.getInfo(`js-${run}-none`), SecretNotFoundError)
assert.equal(await Secret.destroy(a.secretId), true)
assert.equal(await Secret.destroy(b.name), true)
assert.equal(await Secret.exists(a.secretId), false)

// Volumes and their content.
const vol = await Volume.create(`js-${run}`)
assert.equal(vol.volumeId, `js-${run}`)
const st = await vol.writeFile('/f.txt', 'from node', { mode: 0o640, uid: 1000, gid: 1000 })
assert.deepEqual([st.size, st.mode, st.uid], [9, 0o640, 1000])
assert.equal(await vol.readFile('f.txt'), 'from node')
await assert.rejects(vol.writeFile('/f.txt', 'again'), VolumeError)
await vol.writeFile('/f.txt', new Blob(['blob body']), { force: true })
assert.equal(await vol.readFile('/f.txt'), 'blob body')
await vol.makeDir('/d/e', { force: true })
assert.deepEqual((await vol.list('/')).map((e) => e.name).sort(), ['d', 'f.txt'])
assert.equal((await vol.updateMetadata('/f.txt', { mode: 0o600 })).mode, 0o600)
await vol.remove('/d')
assert.equal(await vol.exists('/d'), false)
await assert.rejects(vol.readFile('/d'), VolumePathNotFoundError)
assert.equal((await Volume.getInfo(vol.volumeId)).token, vol.token)
assert.equal(await Volume.destroy(vol.volumeId), true)
assert.equal(await Volume.destroy(vol.volumeId), false)
console.log('node volumes and secrets ok')
