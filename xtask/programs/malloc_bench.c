
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;

__attribute__((noinline)) static void use(void *block) {
    ((volatile unsigned char *)block)[0] = 1;
    sink += (unsigned long)block & 0xff;
}

__attribute__((noinline)) static void pairs(long n) {
    for (long i = 0; i < n; i++) {
        void *block = malloc(64);
        use(block);
        free(block);
    }
}

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 3)
        return 2;
    long total = atol(argv[1]), rounds = atol(argv[2]);
    char line[16];
    /* Warm up (binds the PLT entries, fills the tcache) and allocate stdin's and stdout's
     * buffers before any probe is attached. */
    pairs(10000);
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 1;
    for (long r = 0; r < rounds; r++) {
        double start = now_ns();
        pairs(total / rounds);
        printf("round %.3f\n", (now_ns() - start) / (double)(total / rounds));
        fflush(stdout);
    }
    printf("done %lu\n", sink);
    fflush(stdout);
    return 0;
}
