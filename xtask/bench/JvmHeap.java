// The heap-dump cost bench's JVM target (`cargo xtask bench --holds-only`, issue 33).
// Usage: java -XX:+UseSerialGC -cp DIR JvmHeap RECORDS
//   Keeps RECORDS records (an id and a byte[100] each) in the static list HELD, prints
//   `ready BYTES` (the heap used after a collection), then a thread that sleeps 5 ms at a time
//   measures the program's stops: each gap over 100 ms is printed as `gap MS` (a class histogram
//   or a heap dump stops every Java thread at a safepoint while it runs).
import java.util.ArrayList;
import java.util.List;

public class JvmHeap {
    static final class Record {
        final long id;
        final byte[] payload = new byte[100];
        Record(long id) { this.id = id; }
    }

    static final List<Record> HELD = new ArrayList<>();

    public static void main(String[] args) throws Exception {
        long records = Long.parseLong(args[0]);
        System.out.println("PID " + ProcessHandle.current().pid());
        for (long i = 0; i < records; i++) HELD.add(new Record(i));
        System.gc();
        Runtime rt = Runtime.getRuntime();
        System.out.println("ready " + (rt.totalMemory() - rt.freeMemory()));
        long last = System.nanoTime();
        while (true) {
            Thread.sleep(5);
            long now = System.nanoTime();
            long ms = (now - last) / 1_000_000;
            if (ms > 100) System.out.println("gap " + ms);
            last = now;
        }
    }
}
