# How the threads of one op go through its phases together, none waiting for another to arrive:
# each phase is cut into chunks that any thread claims with an atomic counter, and a thread moves on
# once every chunk of the phase is done. A thread that starts late finds the chunks taken and the
# work done, and one thread alone does it all. (gpt2_decode_layer's phases: its layer norms,
# products and attention.)
from std.atomic import Atomic
from std.memory import UnsafePointer, alloc
from std.sys.intrinsics import llvm_intrinsic

comptime LINE = 8  # Int64 counters a cache line: each counter on a line of its own


struct Phases[count: Int](ImplicitlyCopyable):
    """Per phase (`count` of them), two counters shared by the threads: the chunks claimed and the chunks done."""

    var counters: UnsafePointer[Int64, MutUntrackedOrigin]

    def __init__(out self):
        self.counters = alloc[Int64](2 * Self.count * LINE)
        for i in range(2 * Self.count * LINE):
            (self.counters + i).store(0)

    def share[body: def(Int) capturing -> None](self, phase: Int, chunks: Int):
        """Runs `body(c)` for each chunk c < `chunks` no other thread has claimed, then waits until every
        chunk of the phase is done (by whichever thread): what it wrote is then there for all."""
        var claimed = self.counters + 2 * phase * LINE
        var done = claimed + LINE
        while True:
            var chunk = Int(Atomic[Int64].fetch_add(claimed, 1))
            if chunk >= chunks:
                break
            body(chunk)
            _ = Atomic[Int64].fetch_add(done, 1)
        while Int(Atomic[Int64].load(done)) < chunks:
            llvm_intrinsic["llvm.x86.sse2.pause", NoneType]()

    def free(self):
        self.counters.free()


@always_inline
def chunk_span(chunk: Int, chunks: Int, count: Int) -> Tuple[Int, Int]:
    """The items chunk `chunk` of `chunks` takes of `count`, first and one past the last: runs in order
    whose lengths differ by at most one."""
    return chunk * count // chunks, (chunk + 1) * count // chunks
