# dense_rows: the loops of the float32 and bfloat16 products (skinny_matmul.mojo's ops, and
# gpt2_decode_layer's products through layer_products.mojo), y[M, N] = x[M, K] @ W[N, K]^T + bias[N]
# for the rows first..last-1 of W a task is given.
#
# The task walks its rows 24 at a time, and dots those with every row of x (X_ROWS at once) while
# they are in cache, a block of RB rows at a time, every partial sum in a register (MB x RB
# accumulators of a vector register's lanes); where x has several whole groups of X_ROWS rows they
# take the rows of W 6 at a time. Float32 W against one row of x, where no row of W is read twice,
# is cut into RB runs instead, and a block takes a row from each: a thread reads RB long streams.
# Against bfloat16 W, x is rounded to bfloat16 and the sums are
# float32 (bfloat16_products.mojo). float32 W is row-major [N, K] (any Linear's weight), bfloat16 W
# is stored in interleaved groups of 8 rows (packed_layout.mojo), so that the rows a block reads
# together are one stream. Where the CPU has no bfloat16 multiply-adds, bfloat16 W against many
# rows of x is widened to float32 a pass at a time and multiplied as float32 W is (`_passes`).
# Against many rows of x (`MANY_ROWS`) a pass is read from cache more than from memory: x's first
# group alone requests it, and bfloat16 pairs, bound by the multiply-adds, share it whole.
from std.collections import Array
from std.memory import UnsafePointer, alloc
from std.sys.info import CompilationTarget, size_of
from std.sys.intrinsics import prefetch

from .bfloat16_products import BF16_PAIRS, load_operand, multiply_add, operand_dtype, rounded_rows, widened_rows, x_dtype, x_stride
from .epilogue import GELU, STORE, finish, gelu_columns
from .packed_layout import CHUNK, F32, GROUP, LANES, requests_ahead, row_start

# Bytes of W requested ahead of the loads (`requests_ahead`): less left the products slower, more
# gained nothing (docs/performance.md).
comptime PREFETCH_BYTES = 65536
# Rows of x a block of W dots at once: on AVX2, 4 x-rows by 3 W-rows fill the 16 registers
# (8 by 1 measured slower).
comptime X_ROWS = 8 if CompilationTarget.has_avx512f() else 4
comptime PASS_ROWS = 24  # rows of W dotted with every row of x in one pass, while they are in cache
# Rows of W that whole groups of X_ROWS rows of x take at a time where there are several groups:
# two blocks (of 3 rows at X_ROWS), so that a block of W is still in L1, not L2, when the next group
# reads it (3 and 12 rows gained less: docs/performance.md).
comptime SHARED_PASS_ROWS = 6
# Rows of x from which a pass of W is read from cache more than from memory (docs/performance.md).
comptime MANY_ROWS = 32


def w_rows[WT: DType, MB: Int]() -> Int:
    """Rows of W a block dots with MB rows of x: MB x RB accumulators, the RB rows and x in the
    vector registers (32 on AVX-512, 16 on AVX2), RB dividing `PASS_ROWS`. Float32 W against one row
    of x reads fewer rows at a time than registers allow, one from each of RB runs (`_runs`): on
    AVX-512 a row at a time, one stream of memory a thread; on AVX2 4 rows. Each measured faster
    than 8 neighbouring rows, and bfloat16's interleaved groups slower read a row at a time
    (docs/performance.md)."""
    comptime if WT == F32 and MB == 1:
        return 1 if CompilationTarget.has_avx512f() else 4
    comptime if CompilationTarget.has_avx512f():
        return 3 if MB > 4 else (4 if MB > 2 else 8)
    return 3 if MB > 2 else (4 if MB == 2 else 8)


@always_inline
def _block[
    WT: DType, MB: Int, RB: Int, EPILOGUE: Int, REQUESTS: Bool = True
](
    x: UnsafePointer[Scalar[x_dtype[WT]()], ImmutAnyOrigin],
    w: UnsafePointer[Scalar[WT], ImmutAnyOrigin],
    bias: UnsafePointer[Float32, ImmutAnyOrigin],
    has_bias: Bool,
    y: UnsafePointer[Float32, MutAnyOrigin],
    K: Int,
    N: Int,
    n: Int,
    chunk_end: Int,
    apart: Int = 1,
):
    """Y[m, n + r * apart] (+ its bias) for m < MB, r < RB; x and y point at the group's first row
    (x's rows `x_stride` apart), and this task's rows of W lie before element `chunk_end` of w."""
    # Rows `apart` > 1 rows apart are RB streams, each requested ahead by its share of the bytes.
    var AHEAD = PREFETCH_BYTES // size_of[WT]() // (RB if apart > 1 else 1)
    comptime PAIRS = WT != F32 and BF16_PAIRS
    comptime STEP = 2 * LANES if PAIRS else LANES  # values a multiply-add takes
    # bfloat16 against one row of x requests nothing past its chunk (the other thread's rows, or
    # past W), which shortens its steps; against several rows the check costs more than it saves,
    # and float32 gains nothing (docs/performance.md).
    comptime WITHIN_CHUNK = WT != F32 and MB == 1
    var stride = x_stride[WT](K)
    var acc = Array[SIMD[F32, LANES], MB * RB](fill=SIMD[F32, LANES](0))
    var starts = Array[Int, RB](uninitialized=True)
    comptime for r in range(RB):
        starts[r] = row_start[WT](n + r * apart, K)
    var vector_end = K // STEP * STEP if WT == F32 else stride  # bfloat16: padded with zeros
    var k = 0
    var at = 0  # where value k of a row is, from the row's start (kept up as k moves)
    while k < vector_end:
        # A bfloat16 row's line (`CHUNK` values) takes CHUNK / STEP passes (on AVX-512 one in pairs,
        # two lane by lane); against several rows of x it is requested on the first only, against
        # one row on every pass (each the faster there: docs/performance.md).
        var request = WT == F32 or MB == 1 or at % CHUNK == 0
        var rows = Array[SIMD[operand_dtype[PAIRS](), STEP], RB](uninitialized=True)
        comptime for r in range(RB):
            var row = w + starts[r] + at
            rows[r] = load_operand[WT, PAIRS, STEP](row)
            if REQUESTS and request and (not WITHIN_CHUNK or starts[r] + at + AHEAD < chunk_end):
                prefetch[requests_ahead[WT == F32 and MB == 1]()](row + AHEAD)
        comptime for m in range(MB):
            var xv = load_operand[x_dtype[WT](), PAIRS, STEP](x + m * stride + k)
            comptime for r in range(RB):
                acc[m * RB + r] = multiply_add[PAIRS, STEP](acc[m * RB + r], rows[r], xv)
        k += STEP
        at += STEP
        comptime if WT != F32:
            if k % CHUNK == 0:  # on to the row's next chunk, past the group's other rows
                at += (GROUP - 1) * CHUNK
    comptime for m in range(MB):
        comptime for r in range(RB):
            var total = acc[m * RB + r].reduce_add()
            for tail in range(vector_end, K):  # float32 only
                total += w[starts[r] + tail].cast[F32]() * x[m * stride + tail].cast[F32]()
            var out = n + r * apart
            finish[EPILOGUE, 1](y + m * N + out, total + bias[out] if has_bias else total)


@always_inline
def _rows[
    WT: DType, MB: Int, RB: Int, EPILOGUE: Int, REQUESTS: Bool = True
](
    x: UnsafePointer[Scalar[x_dtype[WT]()], ImmutAnyOrigin],
    w: UnsafePointer[Scalar[WT], ImmutAnyOrigin],
    bias: UnsafePointer[Float32, ImmutAnyOrigin],
    has_bias: Bool,
    y: UnsafePointer[Float32, MutAnyOrigin],
    K: Int,
    N: Int,
    first: Int,
    end: Int,
    chunk_end: Int,
):
    """Rows first..end-1 of W against MB consecutive rows of x; `chunk_end` is where this task's rows of
    W end (element of w), which `_block`'s prefetches stay before."""
    var n = first
    while n + RB <= end:
        _block[WT, MB, RB, EPILOGUE, REQUESTS](x, w, bias, has_bias, y, K, N, n, chunk_end)
        n += RB
    while n < end:
        _block[WT, MB, 1, EPILOGUE, REQUESTS](x, w, bias, has_bias, y, K, N, n, chunk_end)
        n += 1


def _runs[
    EPILOGUE: Int
](
    x: UnsafePointer[Float32, ImmutAnyOrigin],
    w: UnsafePointer[Float32, ImmutAnyOrigin],
    bias: UnsafePointer[Float32, ImmutAnyOrigin],
    has_bias: Bool,
    y: UnsafePointer[Float32, MutAnyOrigin],
    K: Int,
    N: Int,
    first: Int,
    last: Int,
):
    """Float32 rows first..last-1 of W against one row of x, cut into RB runs (`w_rows`), a block
    taking the i-th row of each: RB streams as long as a run, where RB neighbouring rows start RB
    new streams every RB rows (at K = 768, every 12 KB): faster batch-1 steps, outputs identical
    (docs/performance.md)."""
    comptime RB = w_rows[F32, 1]()
    var run = (last - first) // RB
    var chunk_end = last * K
    var xs = rebind[UnsafePointer[Scalar[x_dtype[F32]()], ImmutAnyOrigin]](x)
    for i in range(run):
        _block[F32, 1, RB, EPILOGUE](xs, w, bias, has_bias, y, K, N, first + i, chunk_end, run)
    _rows[F32, 1, 1, EPILOGUE](xs, w, bias, has_bias, y, K, N, first + run * RB, last, chunk_end)


@always_inline
def _pass[
    WT: DType, EPILOGUE: Int, SHARED_ROWS: Int = SHARED_PASS_ROWS, REQUESTS: Bool = True, LATER_REQUESTS: Bool = REQUESTS
](
    x: UnsafePointer[Scalar[x_dtype[WT]()], ImmutAnyOrigin],
    w: UnsafePointer[Scalar[WT], ImmutAnyOrigin],
    bias: UnsafePointer[Float32, ImmutAnyOrigin],
    has_bias: Bool,
    y: UnsafePointer[Float32, MutAnyOrigin],
    M: Int,
    K: Int,
    N: Int,
    start: Int,
    end: Int,
    chunk_end: Int,
):
    """Rows start..end-1 of W (a pass) against every row of x: whole groups of X_ROWS rows of x,
    when there are two groups or more, SHARED_ROWS rows of W at a time, and the rest of x the whole
    pass; W requested ahead where REQUESTS (W in memory, not a widened pass in cache), by groups
    after the first where LATER_REQUESTS. GELU comes last, over the pass's columns, a vector at a
    time."""
    comptime WRITES = STORE if EPILOGUE == GELU else EPILOGUE
    var stride = x_stride[WT](K)
    var shared = 0 if M <= X_ROWS else M // X_ROWS * X_ROWS
    comptime RB = w_rows[WT, X_ROWS]()
    var part = start
    while part < end and shared > 0:
        var part_end = min(part + SHARED_ROWS, end)
        _rows[WT, X_ROWS, RB, WRITES, REQUESTS](x, w, bias, has_bias, y, K, N, part, part_end, chunk_end)
        for m in range(X_ROWS, shared, X_ROWS):
            _rows[WT, X_ROWS, RB, WRITES, LATER_REQUESTS](x + m * stride, w, bias, has_bias, y + m * N, K, N, part, part_end, chunk_end)
        part = part_end
    var m = shared
    while m < M:  # groups of up to X_ROWS rows of x; fewer rows leave registers for more rows of W
        var left = min(M - m, X_ROWS)
        comptime for MB in range(1, X_ROWS + 1):
            if left == MB:
                _rows[WT, MB, w_rows[WT, MB](), WRITES, REQUESTS](x + m * stride, w, bias, has_bias, y + m * N, K, N, start, end, chunk_end)
        m += left
    comptime if EPILOGUE == GELU:  # 8 wide: a pass's 24 columns take no tanh a value at a time
        gelu_columns[8](y, M, N, start, end)


def _passes[
    WT: DType, EPILOGUE: Int
](
    x: UnsafePointer[Scalar[x_dtype[WT]()], ImmutAnyOrigin],
    w: UnsafePointer[Scalar[WT], ImmutAnyOrigin],
    bias: UnsafePointer[Float32, ImmutAnyOrigin],
    has_bias: Bool,
    y: UnsafePointer[Float32, MutAnyOrigin],
    M: Int,
    K: Int,
    N: Int,
    first: Int,
    last: Int,
):
    """`dense_rows` on x as the multiply-adds take it (`x_dtype`, rows `x_stride` apart), a pass of
    `PASS_ROWS` rows of W at a time. bfloat16 W that is multiplied lane by lane (no `BF16_PAIRS`)
    against `MANY_ROWS` rows of x or more is widened to float32 a pass at a time, once, and the
    pass runs as float32's: the same products and sums in the same order, so the same outputs."""
    comptime WIDENS = WT != F32 and not BF16_PAIRS
    var start = first
    comptime if WIDENS:
        if M >= MANY_ROWS:
            var stride = x_stride[WT](K)
            var panel = alloc[Float32](PASS_ROWS * stride)
            var reads = UnsafePointer[Float32, ImmutAnyOrigin](unsafe_from_address=Int(panel))
            var xs = rebind[UnsafePointer[Scalar[x_dtype[F32]()], ImmutAnyOrigin]](x)
            while start < last:
                var end = min(start + PASS_ROWS, last)
                widened_rows[WT](w, panel, K, start, end)
                _pass[F32, EPILOGUE, PASS_ROWS, False](xs, reads, bias + start, has_bias, y + start, M, stride, N, 0, end - start, (end - start) * stride)
                start = end
            panel.free()
            return
    var chunk_end = row_start[WT](last, K)
    # Pairs, bound by the multiply-adds rather than W's stream, share the whole pass (docs/performance.md).
    comptime SHARED_MANY = PASS_ROWS if WT != F32 and BF16_PAIRS else SHARED_PASS_ROWS
    while start < last:
        var end = min(start + PASS_ROWS, last)
        if M >= MANY_ROWS:
            _pass[WT, EPILOGUE, SHARED_MANY, True, False](x, w, bias, has_bias, y, M, K, N, start, end, chunk_end)
        else:
            _pass[WT, EPILOGUE](x, w, bias, has_bias, y, M, K, N, start, end, chunk_end)
        start = end


def dense_rows[
    WT: DType, EPILOGUE: Int
](
    x: UnsafePointer[Float32, ImmutAnyOrigin],
    w: UnsafePointer[Scalar[WT], ImmutAnyOrigin],
    bias: UnsafePointer[Float32, ImmutAnyOrigin],
    has_bias: Bool,
    y: UnsafePointer[Float32, MutAnyOrigin],
    M: Int,
    K: Int,
    N: Int,
    first: Int,
    last: Int,
):
    """Columns first..last-1 of Y = x @ W^T (+ bias), written as EPILOGUE says (epilogue.mojo).

    Float32 W against one row of x in runs (`_runs`); otherwise `PASS_ROWS` rows of W at a time
    (`SHARED_PASS_ROWS` for whole groups of x), against every row of x while they are in cache
    (past 8 rows of x a chunk no longer fits the cache by the second pass). Against bfloat16 W, x
    is first rounded to bfloat16, by every task for itself (a few microseconds against the
    product's hundreds)."""
    comptime XT = x_dtype[WT]()
    comptime if WT == F32:
        if M == 1:
            _runs[EPILOGUE](x, rebind[UnsafePointer[Float32, ImmutAnyOrigin]](w), bias, has_bias, y, K, N, first, last)
            return
        _passes[WT, EPILOGUE](rebind[UnsafePointer[Scalar[XT], ImmutAnyOrigin]](x), w, bias, has_bias, y, M, K, N, first, last)
    else:
        var rounded = rounded_rows[XT](x, M, K)
        var reads = UnsafePointer[Scalar[XT], ImmutAnyOrigin](unsafe_from_address=Int(rounded))
        _passes[WT, EPILOGUE](reads, w, bias, has_bias, y, M, K, N, first, last)
        rounded.free()
