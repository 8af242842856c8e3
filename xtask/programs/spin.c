
#include <stdlib.h>
static volatile unsigned long sink;
__attribute__((noinline)) static void spin(int depth) {
    if (depth == 0)
        for (;;) sink++;
    spin(depth - 1);
    sink++; /* work after the call keeps it from becoming a tail call */
}
int main(int argc, char **argv) {
    spin(argc > 1 ? atoi(argv[1]) : 16);
    return 0;
}
