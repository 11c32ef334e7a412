// Attacks the compile step's memory: the preprocessor reads an endless file. The run's
// memory limit must stop the compiler (oom_killed), and the run fail.
#include "/dev/zero"
int main(void) { return 0; }
