// Drives @segment/analytics-node against a Mallard server: node send_segment.js HOST WRITE_KEY PREFIX
// Prints {"errors": [...], "requests": N} and exits 1 if any call was not delivered.
const { Analytics } = require('@segment/analytics-node')

async function main() {
  const [host, writeKey, prefix] = process.argv.slice(2)
  const analytics = new Analytics({ writeKey, host, maxRetries: 2, flushInterval: 200 })
  const errors = []
  let requests = 0
  analytics.on('error', (err) => errors.push(String(err.reason || err.code || err)))
  analytics.on('http_request', () => requests++)
  const userId = `${prefix}-user`
  analytics.identify({ userId, traits: { email: `${prefix}@example.com`, plan: 'node' } })
  analytics.track({ userId, event: 'Node Tracked', properties: { n: 1 } })
  analytics.page({ userId, category: 'Docs', name: 'Node Page', properties: { p: 1 } })
  analytics.screen({ userId, name: 'Node Screen' })
  analytics.group({ userId, groupId: 'g-node', traits: { name: 'Acme' } })
  analytics.alias({ userId, previousId: `${prefix}-anon` })
  await analytics.closeAndFlush({ timeout: 20000 })
  process.stdout.write(JSON.stringify({ errors, requests }) + '\n')
  process.exit(errors.length ? 1 : 0)
}

main().catch((err) => {
  console.error(err)
  process.exit(2)
})
