// The heap-snapshot cost bench's Node target (`cargo xtask bench --holds-only`, issue 33).
// Usage: node node_heap.js OBJECTS
//   Makes OBJECTS objects ({ i, s }: a number and a 40-character string of its own) held by the
//   module-level array `kept`, then takes one heap snapshot of itself through the in-process
//   inspector (inspector.Session: no socket, no tracer) and prints
//   `inproc FIRST_CHUNK_MS TOTAL_MS BYTES CHUNKS`: the untraced cost of the same snapshot.
//   Then prints `ready` and runs a 5 ms timer that measures the event loop's stops: each gap
//   over 100 ms between two ticks is printed as `gap MS`, the time the program could not run
//   (a heap snapshot taken from outside stops it while V8 builds and writes the snapshot).
const inspector = require("inspector");
const objects = +process.argv[2];
console.log(`PID ${process.pid}`);

const kept = [];
for (let i = 0; i < objects; i++) kept.push({ i, s: ("s" + i).padEnd(40, ".") });

function inProcessSnapshot() {
  const session = new inspector.Session();
  session.connect();
  let first = null;
  let bytes = 0;
  let chunks = 0;
  const t0 = process.hrtime.bigint();
  session.on("HeapProfiler.addHeapSnapshotChunk", (m) => {
    if (first === null) first = process.hrtime.bigint();
    bytes += m.params.chunk.length;
    chunks++;
  });
  session.post("HeapProfiler.takeHeapSnapshot", { reportProgress: false }, () => {
    const ms = (t) => Number(t - t0) / 1e6;
    console.log(`inproc ${ms(first).toFixed(1)} ${ms(process.hrtime.bigint()).toFixed(1)} ${bytes} ${chunks}`);
    session.disconnect();
    console.log(`ready ${kept.length}`);
    let last = Date.now();
    setInterval(() => {
      const now = Date.now();
      if (now - last > 100) console.log(`gap ${now - last}`);
      last = now;
    }, 5);
  });
}
setTimeout(inProcessSnapshot, 100);
