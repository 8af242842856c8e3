
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>

extern char **environ;
static volatile sig_atomic_t stop;

static void on_term(int sig) { (void)sig; stop = 1; }

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    long period_ns = 1000000000L / atol(argv[1]);
    signal(SIGTERM, on_term);
    char *args[] = {"/bin/true", NULL};
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    long started = 0;
    while (!stop) {
        pid_t pid;
        if (posix_spawn(&pid, "/bin/true", NULL, NULL, args, environ) == 0) {
            waitpid(pid, NULL, 0);
            started++;
        }
        next.tv_nsec += period_ns;
        while (next.tv_nsec >= 1000000000L) {
            next.tv_nsec -= 1000000000L;
            next.tv_sec++;
        }
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
    }
    printf("%ld\n", started);
    return 0;
}
