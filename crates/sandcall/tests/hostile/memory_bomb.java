// Attacks the memory limit (memory_limit_mb) from Java: keeps every MiB it allocates.
// The JVM's heap is sized from the limit, so the JVM itself must refuse (OutOfMemoryError)
// before the cgroup has to kill it.
import java.util.ArrayList;

public class MemoryBomb {
    public static void main(String[] args) {
        ArrayList<byte[]> kept = new ArrayList<>();
        for (;;) {
            byte[] b = new byte[1 << 20];
            b[0] = 1;
            kept.add(b);
        }
    }
}
